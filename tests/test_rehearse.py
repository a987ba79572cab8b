"""The dress rehearsal against a fake workshop (tests/fixtures/fake_cluster_workshop.json, made up for the tests):
three participants, ws-02's engine crash-looping. The rehearsal reports ws-02 with its fix and the others as
ready, keeps every row in its CSV as it completes, and loses nothing when interrupted."""

from __future__ import annotations

import copy
import csv
import json
import os
import sys
from pathlib import Path
from typing import Sequence

import pytest
from fakes import fake_kubectl_on_path
from script_module import load_script

from helpers.cli.main import main
from helpers.cluster import rehearse
from helpers.cluster.kubectl import CommandResult
from helpers.cluster.namespaces import ParticipantStatus

FIXTURES = Path(__file__).resolve().parent / "fixtures"
fake_kubectl = load_script(FIXTURES / "fake_kubectl.py")


def workshop() -> dict:
    """The fake workshop's state (a fresh copy)."""
    return json.loads((FIXTURES / "fake_cluster_workshop.json").read_text())


class FakeCluster:
    """The fake kubectl in-process, as a runner: answers from the fake workshop and records every call."""

    def __init__(self, cluster: dict | None = None) -> None:
        self.cluster = cluster or workshop()
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> CommandResult:
        self.calls.append(list(args))
        try:
            return CommandResult(tuple(args), 0, fake_kubectl.run_cluster(self.cluster, list(args)), "")
        except fake_kubectl.Exit as done:
            return CommandResult(tuple(args), done.code, done.stdout, done.stderr)


@pytest.fixture
def fake_cluster_on_path(tmp_path, monkeypatch) -> Path:
    """A `kubectl` first on PATH that is the fake workshop; returns the state file (its calls beside it)."""
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"cluster": workshop()}))
    fake_kubectl_on_path(tmp_path, monkeypatch, state)
    return state


def test_the_fixture_says_it_is_made_up():
    assert "made up for the tests" in workshop()["_note"].lower()


def test_rehearsal_reports_the_failing_namespace_with_its_fix_and_the_others_ready():
    fake, seen = FakeCluster(), []
    found = rehearse.participants("ws", fake)
    rows = {r.namespace: r for r in rehearse.rehearse(found, seen.append, fake)}
    assert [r.namespace for r in seen] == ["ws-01", "ws-02", "ws-03"]
    assert rows["ws-01"] == rehearse.RehearsalRow("ws-01", "yes", 0.084, "ok (41.2 s)", "")
    assert rows["ws-03"].ok and rows["ws-03"].first_token_s == 0.097
    bad = rows["ws-02"]
    assert not bad.ok and bad.engine_ready == "no" and bad.first_token_s is None
    assert bad.notebook == "not run: the engine is not ready"
    assert "crash-loops" in bad.fix and "kubectl logs -n ws-02 deploy/vllm --previous" in bad.fix
    assert "workshop reset ws-02" in bad.fix
    # the crash-looping engine is not probed, and nothing runs in its namespace
    assert not [c for c in fake.calls if c[:3] == ["exec", "-n", "ws-02"]]
    probes = [c for c in fake.calls if c[0] == "exec"]
    assert all(c[3:7] == ["deploy/notebook", "-c", "notebook", "--"] for c in probes)
    assert rehearse.summary(list(rows.values())) == "2/3 participants ready; to fix: ws-02"


def test_an_engine_that_is_ready_but_gives_no_token_is_a_row_to_fix():
    cluster = workshop()
    cluster["participants"]["ws-03"]["probe"] = {"ok": False, "first_token_s": None,
                                                 "error": "HTTPError: HTTP Error 401: Unauthorized"}
    row = rehearse.rehearse(rehearse.participants("ws", FakeCluster(cluster)), lambda r: None,
                            FakeCluster(cluster))[2]
    assert row.namespace == "ws-03" and row.engine_ready == "no" and "401" in row.fix and "API key" in row.fix


def test_a_notebook_that_fails_says_how_to_see_the_cell():
    cluster = workshop()
    cluster["participants"]["ws-01"]["notebook_run"] = copy.deepcopy(
        cluster["participants"]["ws-02"]["notebook_run"])
    row = rehearse.rehearse(rehearse.participants("ws", FakeCluster(cluster), only=["ws-01"]), lambda r: None,
                            FakeCluster(cluster))[0]
    assert row.engine_ready == "yes" and row.notebook.startswith("failed: FAILED 01_connect")
    assert "kubectl exec -n ws-01 deploy/notebook -c notebook -- workshop run" in row.fix


@pytest.mark.parametrize("state, words", [("no pod", "workshop reset"), ("unschedulable: 0/4 nodes", "GPU nodes"),
                                          ("downloading models", "cluster-status"), ("ImagePullBackOff", "image"),
                                          ("starting", "rehearse again"), ("init: failed", "wait-for-models")])
def test_every_engine_state_has_a_fix(state, words):
    assert words in rehearse.engine_fix("ws-04", state)


def test_a_missing_notebook_pod_is_said_and_nothing_is_run():
    fake = FakeCluster()
    row = rehearse.rehearse_one(ParticipantStatus("ws-09", "ready", "no pod", 0, "-"), fake)
    assert row.notebook.startswith("not run") and "notebook pod is no pod" in row.fix and fake.calls == []


def test_the_instructors_namespace_is_not_a_participant():
    cluster = workshop()
    cluster["participants"]["ws-models"] = cluster["participants"]["ws-01"]
    assert [p.namespace for p in rehearse.participants("ws", FakeCluster(cluster))] == ["ws-01", "ws-02", "ws-03"]
    with pytest.raises(rehearse.ProvisionError, match="ws-07"):
        rehearse.participants("ws", FakeCluster(), only=["ws-07"])


def test_the_csv_holds_each_row_and_reads_back(tmp_path):
    log = rehearse.RehearsalLog(tmp_path / "rehearsal.csv")
    row = rehearse.RehearsalRow("ws-01", "yes", 0.084, "ok (41.2 s)", "")
    log.write(row)
    assert rehearse.read_log(log.path) == [row]
    assert next(csv.reader(log.path.open())) == rehearse.CSV_FIELDS


def test_an_interrupted_rehearsal_keeps_what_it_checked(tmp_path):
    fake, log = FakeCluster(), rehearse.RehearsalLog(tmp_path / "rehearsal.csv")
    found = rehearse.participants("ws", fake)

    def write_then_stop(row):
        log.write(row)
        if row.namespace == "ws-02":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rehearse.rehearse(found, write_then_stop, fake)
    kept = rehearse.read_log(log.path)
    assert [r.namespace for r in kept] == ["ws-01", "ws-02"]
    assert rehearse.summary(kept, expected=3) == "1/2 participants ready; to fix: ws-02; 1 not checked (interrupted)"


def test_a_parallel_rehearsal_finds_the_same():
    fake = FakeCluster()
    rows = rehearse.rehearse(rehearse.participants("ws", fake), lambda r: None, fake, parallel=3)
    assert [(r.namespace, r.ok) for r in rows] == [("ws-01", True), ("ws-02", False), ("ws-03", True)]


def test_the_table_has_one_line_per_namespace():
    rows = rehearse.rehearse(rehearse.participants("ws", FakeCluster()), lambda r: None, FakeCluster())
    lines = rehearse.table_lines(rows)
    assert lines[0].split()[:4] == ["namespace", "engine", "ready", "first"]
    assert lines[1].startswith("ws-01") and "84 ms" in lines[1] and "ok (41.2 s)" in lines[1]
    assert lines[2].startswith("ws-02") and lines[2].rstrip().endswith("then workshop reset ws-02")


# ---------------------------------------------------------------- the command, through the fake kubectl on PATH

def test_workshop_rehearse_prints_one_table_and_keeps_the_csv(fake_cluster_on_path, tmp_path, capsys):
    assert main(["rehearse", "--prefix", "ws", "--workshop-dir", str(tmp_path / "ws")]) == 1  # one to fix
    out = capsys.readouterr().out
    assert "rehearsing 3 namespaces (ws-01 ... ws-03)" in out
    table = out[out.index("namespace "):].splitlines()
    assert [line.split()[0] for line in table[1:4]] == ["ws-01", "ws-02", "ws-03"]
    assert table[-1] == "2/3 participants ready; to fix: ws-02"
    kept = rehearse.read_log(tmp_path / "ws" / "rehearsal.csv")
    assert [r.ok for r in kept] == [True, False, True] and "crash-loops" in kept[1].fix
    calls = [json.loads(line) for line in Path(str(fake_cluster_on_path) + ".calls").read_text().splitlines()]
    assert calls[0][:3] == ["get", "pods", "--all-namespaces"]


def test_workshop_rehearse_ctrl_c_prints_the_partial_table(fake_cluster_on_path, tmp_path, capsys, monkeypatch):
    real = rehearse.rehearse_one

    def stop_at_the_third(participant, runner=None, parameters=()):
        if participant.namespace == "ws-03":
            raise KeyboardInterrupt
        return real(participant, runner, parameters)

    monkeypatch.setattr(rehearse, "rehearse_one", stop_at_the_third)
    assert main(["rehearse", "--prefix", "ws", "--workshop-dir", str(tmp_path)]) == 130
    out = capsys.readouterr().out
    assert "interrupted: 2 of 3 namespaces checked" in out
    assert out.rstrip().endswith("1/2 participants ready; to fix: ws-02; 1 not checked (interrupted)")
    assert [r.namespace for r in rehearse.read_log(tmp_path / "rehearsal.csv")] == ["ws-01", "ws-02"]


def test_workshop_rehearse_without_participants_says_where_to_look(fake_cluster_on_path, tmp_path, capsys):
    assert main(["rehearse", "--prefix", "lab", "--workshop-dir", str(tmp_path)]) == 2
    assert "no participant namespaces found for --prefix lab" in capsys.readouterr().out


# ---------------------------------------------------------------- the probe that runs in the notebook pod

class _StreamingEngine:
    """A local stand-in for the engine's /v1/completions, streaming one token as vLLM's server does (SSE)."""

    def __init__(self, key: str, model: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        engine = self
        self.requests: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.requests.append(body)
                if self.headers.get("Authorization") != f"Bearer {key}":
                    self.send_response(401)
                    self.end_headers()
                    self.wfile.write(b'{"error": "Unauthorized"}')
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunk = {"id": "cmpl-1", "object": "text_completion", "model": model,
                         "choices": [{"index": 0, "text": " there", "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()  # the port refuses connections from now on


def _probe(env: dict[str, str]) -> dict:
    import subprocess

    out = subprocess.run([sys.executable, "-c", rehearse.PROBE_SCRIPT], env={"PATH": os.environ["PATH"], **env},
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_probe_times_the_first_token_with_the_pods_own_settings():
    engine = _StreamingEngine(key="k-123", model="Qwen/Qwen3-4B")
    try:
        answer = _probe({"VLLM_HOST": engine.url, "MODEL_NAME": "Qwen/Qwen3-4B", "VLLM_API_KEY": "k-123"})
        assert answer["ok"] and answer["first_token_s"] > 0 and answer["error"] is None
        assert engine.requests[0] == {"model": "Qwen/Qwen3-4B", "prompt": "Hello", "max_tokens": 1, "stream": True}
        refused = _probe({"VLLM_HOST": engine.url.removesuffix("/v1"), "MODEL_NAME": "Qwen/Qwen3-4B",
                          "VLLM_API_KEY": "wrong"})
        assert not refused["ok"] and "401" in refused["error"] and refused["first_token_s"] is None
    finally:
        engine.close()
    gone = _probe({"VLLM_HOST": engine.url, "MODEL_NAME": "Qwen/Qwen3-4B"})
    assert not gone["ok"] and "URLError" in gone["error"]


def test_the_notebook_result_is_read_from_what_workshop_run_prints():
    source = (Path(__file__).resolve().parent.parent / "helpers/cli/main.py").read_text()
    assert 'print(f"ok  {path.name}  {run.seconds:.1f} s  -> {run.output}")' in source  # what run_notebook_01 parses
    assert 'print(f"FAILED {err}", file=sys.stderr)' in source


def test_a_notebook_run_that_kubectl_gives_up_on_is_not_finished():
    fake = FakeCluster()

    def slow(args):
        if args[-4:-2] == ["--out", rehearse.REHEARSAL_OUT] or "workshop" in args:
            raise rehearse.ProvisionError("kubectl exec -n did not answer within 300 s: check `kubectl cluster-info`.")
        return fake(args)

    row = rehearse.rehearse_one(ParticipantStatus("ws-01", "ready", "ready", 0, "node"), slow)
    assert row.engine_ready == "yes" and row.first_token_s == 0.084
    assert row.notebook.startswith("not finished: kubectl exec") and "workshop run" in row.fix and not row.ok


def test_a_provisioned_namespace_without_pods_is_not_missed():
    found = rehearse.participants("ws", FakeCluster(), expected=["ws-01", "ws-02", "ws-03", "ws-04"])
    assert [p.namespace for p in found] == ["ws-01", "ws-02", "ws-03", "ws-04"]
    row = rehearse.rehearse_one(found[-1], FakeCluster())
    assert row == rehearse.RehearsalRow("ws-04", "no", None, "not run: no pods",
                                        "no pods in ws-04: applied, or deleted since? kubectl get all -n ws-04; "
                                        "workshop reset ws-04 puts its manifests back")


def test_workshop_rehearse_reads_the_namespaces_provision_wrote(fake_cluster_on_path, tmp_path, capsys):
    from helpers.cluster import overlays

    out = tmp_path / "lab"
    overlays.render(4, "ws", "Qwen/Qwen3-4B", "h100", out, model_nfs="10.0.0.5:/workshop-models",
                    kube_api=["10.0.0.2/32:6443"])
    assert main(["rehearse", "--workshop-dir", str(out)]) == 1  # no --prefix: the one provision wrote
    printed = capsys.readouterr().out
    assert "rehearsing 4 namespaces (ws-01 ... ws-04)" in printed
    assert printed.rstrip().endswith("2/4 participants ready; to fix: ws-02, ws-04")


def test_the_rehearsal_prints_one_restart_table_from_what_workshop_run_printed_in_each_pod(tmp_path):
    from helpers.core.restarts import RestartRow

    cluster = workshop()
    for ns, (core, total) in (("ws-01", (0, 1)), ("ws-03", (2, 2))):
        run = cluster["participants"][ns]["notebook_run"]
        run["stdout"] += RestartRow("01_connect_and_first_agent", core, total, 50.0 + core).encode() + "\n"
    fake = FakeCluster(cluster)
    rows = rehearse.rehearse(rehearse.participants("ws", fake), lambda _: None, fake)
    lines = rehearse.table_lines(rows)
    table = lines[lines.index("Engine restarts (rollouts), the most any namespace made:") + 1:]
    assert table[0].split()[:3] == ["notebook", "core", "all"]
    assert table[1].split()[:4] == ["01_connect_and_first_agent", "2", "2", "51"]  # the most, the mean time
    assert len(table) == 3 and "GPU start-up per restart" in table[2]
    log = rehearse.RehearsalLog(tmp_path / "r.csv")
    for row in rows:
        log.write(row)
    assert rehearse.table_lines(rehearse.read_log(log.path)) == lines  # the CSV keeps the restart lines
