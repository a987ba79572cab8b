"""The dress rehearsal: in every participant's namespace, one generated token from the engine and notebook 01 run
headless, both from inside the participant's notebook pod (``kubectl exec``), so the path checked is the
participant's own: their pod, their NetworkPolicy, their API key, their engine.

``rehearse`` checks the namespaces one by one (or a few at a time) and hands each finished row to ``on_row``
at once: the command line writes it to a CSV before the next namespace is checked, so interrupting the
rehearsal loses nothing already checked. Each row says what to fix, in words an instructor can act on.
Every kubectl call goes through one ``runner`` (``run_kubectl`` when None; tests pass a fake cluster).
"""

from __future__ import annotations

import csv
import json
import re
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Iterable, Sequence

from helpers.cluster.kubectl import ProvisionError, Runner, run_kubectl
from helpers.core.restarts import ROW_PREFIX, decode_rows, merge
from helpers.core.restarts import table_lines as restart_table
from helpers.cluster.namespaces import ParticipantStatus, status

NOTEBOOK_TARGET = "deploy/notebook"  # k8s/base/notebook.yaml: Deployment and container "notebook"
NOTEBOOK_CONTAINER = "notebook"
NOTEBOOK_01 = "/opt/workshop/notebooks/01_connect_and_first_agent.ipynb"  # images/notebook/Containerfile copies it
REHEARSAL_OUT = "/tmp/workshop-rehearsal"  # inside the pod: the executed copy, away from the participant's files
CSV_NAME = "rehearsal.csv"

# Runs in the notebook pod with the image's Python alone: one token from the engine at VLLM_HOST with the pod's
# own MODEL_NAME and VLLM_API_KEY, streamed, so the time to the first chunk is the first-token time. The plain
# completions endpoint, so that no chat template or reasoning parser can hold the one token back. One JSON line.
PROBE_SCRIPT = """
import json, os, time, urllib.request
base = os.environ.get("VLLM_HOST", "").rstrip("/")
base = base if base.endswith("/v1") else base + "/v1"
headers = {"Content-Type": "application/json"}
if os.environ.get("VLLM_API_KEY"):
    headers["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]
body = json.dumps({"model": os.environ.get("MODEL_NAME", ""), "prompt": "Hello", "max_tokens": 1,
                   "stream": True}).encode()
start, first = time.perf_counter(), None
try:
    with urllib.request.urlopen(urllib.request.Request(base + "/completions", body, headers), timeout=120) as r:
        for line in r:
            data = line.strip()[6:] if line.startswith(b"data: ") else b""
            if first is None and data and data != b"[DONE]" and json.loads(data).get("choices"):
                first = time.perf_counter() - start
    print(json.dumps({"ok": first is not None, "first_token_s": first,
                      "error": None if first is not None else "the stream ended without a token"}))
except Exception as err:
    detail = err.read().decode(errors="replace")[:200] if hasattr(err, "read") else ""
    print(json.dumps({"ok": False, "first_token_s": None, "error": f"{type(err).__name__}: {err} {detail}".strip()}))
"""


@dataclass(frozen=True)
class RehearsalRow:
    """One participant's rehearsal: engine ready (one token), first-token time (s), notebook 01, what to fix."""

    namespace: str
    engine_ready: str  # "yes" / "no"
    first_token_s: float | None
    notebook: str  # "ok (12.3 s)", "failed: ...", "not run: ..."
    fix: str  # "" when nothing is to fix
    restarts: str = ""  # the `restarts {...}` lines `workshop run` printed in the pod (helpers.core.restarts)

    @property
    def ok(self) -> bool:
        """True when the engine answered and notebook 01 ran through."""
        return self.engine_ready == "yes" and self.notebook.startswith("ok")


def _exec(namespace: str, command: Sequence[str], runner: Runner | None) -> tuple[int, str, str]:
    """``kubectl exec`` in the participant's notebook container: (exit code, stdout, stderr)."""
    result = (runner or run_kubectl)(["exec", "-n", namespace, NOTEBOOK_TARGET, "-c", NOTEBOOK_CONTAINER, "--",
                                      *command])
    return result.returncode, result.stdout, result.stderr


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:240] if lines else ""


def engine_fix(namespace: str, engine_state: str) -> str:
    """What to do about an engine pod in ``engine_state`` (a word of ``namespaces.status``)."""
    logs = f"kubectl logs -n {namespace} deploy/vllm"
    if engine_state == "no pod":
        return (f"no engine pod: kubectl get deploy,pods -n {namespace}; put the manifests back with "
                f"workshop reset {namespace}")
    if engine_state.startswith("unschedulable"):
        return f"the engine pod is not scheduled ({engine_state}): check the GPU nodes, the share and the quota"
    if engine_state in ("downloading models", "init: PodInitializing") or engine_state.startswith("init: waiting"):
        return ("the engine waits for the room's model download: workshop cluster-status shows its progress; "
                "rehearse again once it is complete")
    if engine_state.startswith("init"):
        return (f"the engine's init container failed ({engine_state}): kubectl logs -n {namespace} deploy/vllm "
                "-c wait-for-models")
    if engine_state == "CrashLoopBackOff":
        return f"the engine crash-loops: {logs} --previous shows why; then workshop reset {namespace}"
    if engine_state in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
        return (f"the engine image does not pull ({engine_state}): kubectl describe pods -n {namespace} "
                "-l app.kubernetes.io/name=vllm; check the image name and the nodes' registry access")
    if engine_state == "starting":
        return f"the engine is still starting: rehearse again in a few minutes ({logs} shows how far it is)"
    return f"the engine is {engine_state}: kubectl describe pods -n {namespace} -l app.kubernetes.io/name=vllm"


def probe_engine(namespace: str, runner: Runner | None = None) -> tuple[bool, float | None, str]:
    """One generated token from the engine, asked from the notebook pod: (ready, first-token time s, error)."""
    code, out, err = _exec(namespace, ["python", "-c", PROBE_SCRIPT], runner)
    if code != 0:
        return False, None, _last_line(err) or f"kubectl exec exited {code}"
    try:
        answer = json.loads(_last_line(out))
    except json.JSONDecodeError:
        return False, None, f"the probe printed no answer: {_last_line(out) or _last_line(err)}"
    return bool(answer.get("ok")), answer.get("first_token_s"), answer.get("error") or ""


_RAN = re.compile(r"^ok\s+\S+\s+([0-9.]+) s")


def run_notebook_01(namespace: str, runner: Runner | None = None,
                    parameters: Iterable[str] = ()) -> tuple[bool, str, str]:
    """Notebook 01 headless in the notebook pod (``workshop run``): (ran through, "ok (N s)" or why it failed, the
    restart lines it printed on the k8s profile)."""
    params = [arg for pair in parameters for arg in ("-p", pair)]
    code, out, err = _exec(namespace, ["workshop", "run", NOTEBOOK_01, "--out", REHEARSAL_OUT, *params], runner)
    restarts = "\n".join(line for line in out.splitlines() if line.startswith(ROW_PREFIX))
    if code == 0:
        seconds = next((m.group(1) for m in map(_RAN.match, out.splitlines()) if m), None)
        return True, f"ok ({seconds} s)" if seconds else "ok", restarts
    return False, f"failed: {_last_line(err) or _last_line(out) or f'exit code {code}'}", restarts


def rehearse_one(participant: ParticipantStatus, runner: Runner | None = None,
                 parameters: Iterable[str] = ()) -> RehearsalRow:
    """Rehearse one participant: the engine's token, then notebook 01; never raises for a cluster error."""
    ns = participant.namespace
    if participant.engine == participant.notebook == "no pod":
        return RehearsalRow(ns, "no", None, "not run: no pods", f"no pods in {ns}: applied, or deleted since? "
                            f"kubectl get all -n {ns}; workshop reset {ns} puts its manifests back")
    if participant.notebook != "ready":
        fix = (f"the notebook pod is {participant.notebook}: kubectl describe pods -n {ns} "
               "-l app.kubernetes.io/name=notebook")
        engine = "no" if participant.engine != "ready" else "unknown"
        return RehearsalRow(ns, engine, None, "not run: no notebook pod to run it in", fix)
    if participant.engine != "ready":
        return RehearsalRow(ns, "no", None, "not run: the engine is not ready",
                            engine_fix(ns, participant.engine))
    try:
        ready, first_token_s, error = probe_engine(ns, runner)
    except ProvisionError as err:  # kubectl missing, the cluster gone, a timeout
        return RehearsalRow(ns, "no", None, "not run", str(err))
    if not ready:
        return RehearsalRow(ns, "no", None, "not run: the engine gave no token",
                            f"the engine pod is ready but gave no token to the notebook pod ({error}): check "
                            f"its NetworkPolicy and API key; kubectl logs -n {ns} deploy/vllm")
    rerun = (f"kubectl exec -n {ns} {NOTEBOOK_TARGET} -c {NOTEBOOK_CONTAINER} -- workshop run {NOTEBOOK_01} "
             f"--out {REHEARSAL_OUT}")
    try:
        ran, notebook, restarts = run_notebook_01(ns, runner, parameters)
    except ProvisionError as err:  # e.g. kubectl's time limit: the notebook may still be running there
        return RehearsalRow(ns, "yes", first_token_s, f"not finished: {err}",
                            f"run notebook 01 in the pod to see how far it gets: {rerun}")
    fix = "" if ran else f"notebook 01 failed in the pod: rerun it there to see the cell: {rerun}"
    return RehearsalRow(ns, "yes", first_token_s, notebook, fix, restarts)


def participants(prefix: str | None, runner: Runner | None = None, only: Sequence[str] = (),
                 expected: Sequence[str] = ()) -> list[ParticipantStatus]:
    """The participants' namespaces (``<prefix>-NN``; the instructor's are left out), optionally only some;
    an ``expected`` namespace without any pod is a row too ("no pod"), so a namespace that is gone is not missed."""
    rows = [r for r in status(prefix, runner) if re.fullmatch(r".+-\d{2}", r.namespace)]
    seen = {r.namespace for r in rows}
    rows = sorted(rows + [ParticipantStatus(ns, "no pod", "no pod", 0, "-") for ns in expected if ns not in seen],
                  key=lambda r: r.namespace)
    if only:
        missing = sorted(set(only) - {r.namespace for r in rows})
        if missing:
            raise ProvisionError(f"not provisioned pods in {', '.join(missing)}: workshop cluster-status lists "
                                 "the namespaces there are")
        rows = [r for r in rows if r.namespace in only]
    return rows


def rehearse(found: Sequence[ParticipantStatus], on_row: Callable[[RehearsalRow], None], runner: Runner | None = None,
             parallel: int = 1, parameters: Iterable[str] = ()) -> list[RehearsalRow]:
    """Rehearse the participants ``found`` (``participants``); each row goes to ``on_row`` as soon as it is known."""
    params = list(parameters)
    done: list[RehearsalRow] = []
    if parallel <= 1:
        for participant in found:
            row = rehearse_one(participant, runner, params)
            on_row(row)
            done.append(row)
        return done
    pool = ThreadPoolExecutor(max_workers=parallel)
    try:
        futures = [pool.submit(rehearse_one, p, runner, params) for p in found]
        for future in as_completed(futures):
            row = future.result()
            on_row(row)
            done.append(row)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # Ctrl-C: what has not started does not start
    return sorted(done, key=lambda r: r.namespace)


# ---------------------------------------------------------------- the record and the table

CSV_FIELDS = [f.name for f in fields(RehearsalRow)]


class RehearsalLog:
    """The rehearsal's CSV, one row written (and flushed) per namespace as it completes."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", newline="") as f:
            csv.writer(f).writerow(CSV_FIELDS)

    def write(self, row: RehearsalRow) -> None:
        """Append one row."""
        values = asdict(row)
        values["first_token_s"] = "" if row.first_token_s is None else f"{row.first_token_s:.3f}"
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, CSV_FIELDS).writerow(values)


def read_log(path: Path | str) -> list[RehearsalRow]:
    """The rows of a rehearsal CSV."""
    with Path(path).open(newline="") as f:
        return [RehearsalRow(r["namespace"], r["engine_ready"],
                             float(r["first_token_s"]) if r["first_token_s"] else None, r["notebook"], r["fix"],
                             r.get("restarts") or "")
                for r in csv.DictReader(f)]


def table_lines(rows: Sequence[RehearsalRow]) -> list[str]:
    """The rehearsal as one aligned table: namespace, engine ready, first-token time, notebook 01, what to fix."""
    header = ("namespace", "engine ready", "first token", "notebook 01", "what to fix")
    body = [(r.namespace, r.engine_ready, "-" if r.first_token_s is None else f"{r.first_token_s * 1000:.0f} ms",
             r.notebook, r.fix or "-") for r in sorted(rows, key=lambda r: r.namespace)]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line[:-1], widths)) + "  " + line[-1]
             for line in [header, *body]]
    restarts = merge(row for r in rows for row in decode_rows(r.restarts))
    if restarts:  # the notebooks' engine restarts, the most any namespace made
        lines += ["", "Engine restarts (rollouts), the most any namespace made:", *restart_table(restarts)]
    return lines


def summary(rows: Sequence[RehearsalRow], expected: int | None = None) -> str:
    """'28/30 participants ready; to fix: ws-03, ws-17' (and how many were not checked, when interrupted)."""
    ready = [r for r in rows if r.ok]
    failing = [r.namespace for r in sorted(rows, key=lambda r: r.namespace) if not r.ok]
    text = f"{len(ready)}/{len(rows)} participants ready"
    text += f"; to fix: {', '.join(failing)}" if failing else ""
    if expected is not None and expected > len(rows):
        text += f"; {expected - len(rows)} not checked (interrupted)"
    return text
