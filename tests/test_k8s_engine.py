"""The Kubernetes engine backend through the real subprocess path, against a fake kubectl: no cluster.

A ``kubectl`` wrapper first on PATH runs tests/fixtures/fake_kubectl.py, which keeps the Deployments
of one participant namespace (kubectl_get_deployments.json: what `kubectl get deployments -o json`
shows for k8s/base as kustomize renders it for ws-01) in a state file, applies the patches the way
the API server does, and answers rollout status, pods, events and logs. A crash-looping pod's
events and log are recorded fixtures (the log is what vLLM's argument parser prints for
``--kv-cache-dtype fp4``, recorded from the vLLM build in .venv; the events are written in the
shape kubectl prints). /v1/models is tests/fake_vllm.py. This has not run against a live cluster;
k8s/README.md lists the steps that verify it on one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import fake_vllm
import pytest
from fakes import fake_kubectl_on_path
import yaml
from fake_vllm import FakeVllm
from script_module import load_script

from helpers.engine import k8s as ke
from helpers.engine.interface import EngineError, EngineStartError, default_config
from helpers.engine.session import EndpointError, connect, make_engine
from helpers.core.vllm_args import EngineConfig, flag_value
from helpers.cluster.overlays import K8S_DIR
from helpers.core.settings import load_settings

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NS = "ws-01"
MODEL = "Qwen/Qwen3-4B"
SECRET = "sk-test-9f8e7d6c5b4a39281706f5e4d3c2b1a0"  # stands for the participant's engine key
BAD_FLAG = ("--kv-cache-dtype", "fp4")  # the fake crash-loops on "fp4", as vLLM would (argparse: invalid choice)
SLOW_FLAG = "--pretend-slow-start"  # the fake's pod with this flag runs but never becomes ready


def _fake_module():
    return load_script(FIXTURES / "fake_kubectl.py")


class Cluster:
    """The fake kubectl's state and the calls it received."""

    def __init__(self, state_path: Path, settings, server: FakeVllm) -> None:
        self.path = state_path
        self.settings = settings
        self.server = server

    def state(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())

    def write(self, state: dict[str, Any]) -> None:
        self.path.write_text(json.dumps(state))

    def deployment(self, name: str = "vllm") -> dict[str, Any]:
        return self.state()["deployments"][name]

    def vllm_args(self) -> list[str]:
        return container(self.deployment(), "vllm")["args"]

    def calls(self) -> list[list[str]]:
        calls_file = Path(str(self.path) + ".calls")
        return [json.loads(line) for line in calls_file.read_text().splitlines()] if calls_file.exists() else []

    def engine(self) -> ke.KubernetesEngine:
        engine = make_engine(self.settings)
        assert isinstance(engine, ke.KubernetesEngine)
        engine.ready_poll_s = 0.01
        return engine


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    spec = deployment["spec"]["template"]["spec"]
    return next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = _fake_module()
    listing = json.loads((FIXTURES / "kubectl_get_deployments.json").read_text())
    state: dict[str, Any] = {"namespace": NS, "pods": [], "crash_tokens": [BAD_FLAG[1]], "hang_tokens": [SLOW_FLAG],
                             "deployments": {d["metadata"]["name"]: d for d in listing["items"]}}
    for name in state["deployments"]:
        fake.roll(state, name)
    state_path = tmp_path / "cluster.json"
    state_path.write_text(json.dumps(state))
    fake_kubectl_on_path(tmp_path, monkeypatch, state_path)
    for name in (ke.DEPLOYMENT_ENV, ke.CONTAINER_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(fake_vllm, "MODEL", MODEL)  # /v1/models lists the Deployment's served name
    server = FakeVllm().start()
    settings = load_settings({"WORKSHOP_PROFILE": "k8s", "VLLM_HOST": server.base_url, "NAMESPACE": NS,
                              "MODEL_NAME": MODEL, "VLLM_API_KEY": SECRET})
    yield Cluster(state_path, settings, server)
    server.stop()


# ---------------------------------------------------------------- defaults and parsing

def test_defaults_and_the_fixture_match_the_manifests():
    docs = list(yaml.safe_load_all((K8S_DIR / "base" / "vllm.yaml").read_text()))
    base = next(d for d in docs if d["kind"] == "Deployment")
    assert base["metadata"]["name"] == ke.DEFAULT_DEPLOYMENT
    vllm = container(base, ke.DEFAULT_CONTAINER)
    recorded = next(d for d in json.loads((FIXTURES / "kubectl_get_deployments.json").read_text())["items"]
                    if d["metadata"]["name"] == "vllm")
    assert container(recorded, "vllm")["args"] == vllm["args"]  # the fixture has not drifted from k8s/base
    assert [e["name"] for e in container(recorded, "vllm")["env"]] == [e["name"] for e in vllm["env"]]


def test_the_k8s_profile_needs_a_namespace():
    settings = load_settings({"WORKSHOP_PROFILE": "k8s", "VLLM_HOST": "http://vllm-engine:8000/v1"})
    with pytest.raises(EngineError, match="NAMESPACE"):
        make_engine(settings)


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl is not installed: cannot compare with its patch code")
def test_the_fake_applies_the_engines_patch_as_kubectl_does(tmp_path):
    """The fake's JSON patch against `kubectl patch --local` (kubectl's own RFC 6902 code, no cluster)."""
    recorded = next(d for d in json.loads((FIXTURES / "kubectl_get_deployments.json").read_text())["items"]
                    if d["metadata"]["name"] == "vllm")
    recorded["spec"]["replicas"] = 0
    engine = ke.KubernetesEngine(load_settings({"WORKSHOP_PROFILE": "k8s", "VLLM_HOST": "http://x:1/v1", "NAMESPACE": NS}))
    config = engine._config_of(recorded)
    changed = EngineConfig(config.model, config.served_name, ("--max-num-seqs", "64"), (*config.env, ("A", "1")))
    ops = engine.patch_ops(recorded, changed)
    assert [op["op"] for op in ops] == ["test", "test", "add", "add", "replace"]
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps(recorded))

    def kubectl_local(patch: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", "patch", "--local", "-f", str(path), "--type=json", "-p", json.dumps(patch),
                               "-o", "json"], capture_output=True, text=True, timeout=60, check=False)

    real = kubectl_local(ops)
    assert real.returncode == 0, real.stderr
    fake = _fake_module()
    assert fake.json_patch(recorded, ops)["spec"] == json.loads(real.stdout)["spec"]
    stale = [ops[0], {**ops[1], "value": ["--model", "other"]}, *ops[2:]]  # args changed since they were read
    refused = kubectl_local(stale)
    assert refused.returncode == 1 and "test failed" in refused.stderr
    with pytest.raises(fake.Exit, match="test failed"):
        fake.json_patch(recorded, stale)


# ---------------------------------------------------------------- reading and changing the Deployment

def test_config_reads_model_served_name_flags_and_only_plain_env(cluster):
    config = cluster.engine().config()
    assert (config.model, config.served_name) == (MODEL, MODEL)
    assert config.args == default_config(load_settings({"WORKSHOP_PROFILE": "gpu"})).args
    env = dict(config.env)
    assert env["HF_HOME"] == "/models/hf" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert "VLLM_API_KEY" not in env and "HF_HUB_OFFLINE" not in env  # references stay unresolved


def test_set_flag_patches_only_the_vllm_containers_args(cluster):
    before = cluster.state()["deployments"]
    engine = cluster.engine()
    engine.set_flag("--max-num-seqs", 64, timeout_s=30)
    after = cluster.state()["deployments"]
    args = cluster.vllm_args()
    assert flag_value(args, "--max-num-seqs") == "64" and args.count("--max-num-seqs") == 1
    assert args[:4] == ["--model", MODEL, "--served-model-name", MODEL]  # provisioning's layout kept
    assert after["notebook"] == before["notebook"]
    assert container(after["vllm"], "predownload") == container(before["vllm"], "predownload")
    old_vllm, new_vllm = container(before["vllm"], "vllm"), container(after["vllm"], "vllm")
    assert {k: v for k, v in new_vllm.items() if k != "args"} == {k: v for k, v in old_vllm.items() if k != "args"}
    patch = next(c for c in cluster.calls() if c[0] == "patch" and "--type=json" in c)
    ops = json.loads(patch[patch.index("-p") + 1])
    assert [op["op"] for op in ops] == ["test", "test", "add"]
    assert ops[0] == {"op": "test", "path": "/spec/template/spec/containers/0/name", "value": "vllm"}
    assert {op["path"] for op in ops[1:]} == {"/spec/template/spec/containers/0/args"}

    engine.set_flag("--enforce-eager", timeout_s=30)  # a bare flag is appended
    assert cluster.vllm_args()[-1] == "--enforce-eager" and flag_value(cluster.vllm_args(), "--max-num-seqs") == "64"
    engine.set_flag("--enforce-eager", None, timeout_s=30)
    assert "--enforce-eager" not in cluster.vllm_args()
    saved = json.loads(cluster.deployment()["metadata"]["annotations"][ke.LAST_GOOD_ANNOTATION])
    assert EngineConfig.from_json(saved) == engine.config() == engine.last_good()


def test_the_vllm_container_is_found_by_name_not_position(cluster):
    state = cluster.state()
    spec = state["deployments"]["vllm"]["spec"]["template"]["spec"]
    sidecar = {"name": "log-shipper", "image": "busybox:1.36", "args": ["--model", "not-this-one"]}
    spec["containers"].insert(0, sidecar)
    cluster.write(state)
    engine = cluster.engine()
    assert engine.config().model == MODEL
    engine.set_flag("--max-num-seqs", 8, timeout_s=30)
    spec = cluster.deployment()["spec"]["template"]["spec"]
    assert spec["containers"][0] == sidecar
    assert flag_value(spec["containers"][1]["args"], "--max-num-seqs") == "8"
    patch = next(c for c in cluster.calls() if c[0] == "patch" and "--type=json" in c)
    assert "/spec/template/spec/containers/1/args" in patch[patch.index("-p") + 1]


def test_set_env_changes_plain_variables_and_refuses_secret_references(cluster):
    engine = cluster.engine()
    engine.set_env("VLLM_LOGGING_LEVEL", "DEBUG", timeout_s=30)
    env = container(cluster.deployment(), "vllm")["env"]
    assert {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"} in env
    key = next(e for e in env if e["name"] == "VLLM_API_KEY")
    assert key["valueFrom"]["secretKeyRef"] == {"name": "vllm-api-key", "key": "api-key", "optional": True}
    with pytest.raises(EngineError, match="VLLM_API_KEY comes from a ConfigMap or Secret reference"):
        engine.set_env("VLLM_API_KEY", "something")


def test_restart_without_a_change_uses_rollout_restart(cluster):
    engine = cluster.engine()
    pod_before = cluster.state()["pods"][-1]["metadata"]["name"]
    engine.restart(timeout_s=30)
    assert ["rollout", "restart", "deployment/vllm", "-n", NS] in cluster.calls()
    assert cluster.state()["pods"][-1]["metadata"]["name"] != pod_before


def test_stop_scales_to_zero_and_restart_brings_it_back(cluster):
    engine = cluster.engine()
    engine.stop()
    assert cluster.deployment()["spec"]["replicas"] == 0
    assert not [p for p in cluster.state()["pods"] if p["metadata"]["labels"]["app.kubernetes.io/name"] == "vllm"]
    assert "no pod" in engine.logs()
    engine.restart(timeout_s=30)
    assert cluster.deployment()["spec"]["replicas"] == 1
    assert "Application startup complete" in engine.logs()


# ---------------------------------------------------------------- failures roll back

def test_a_bad_flag_is_rolled_back_with_the_pods_events_and_log(cluster):
    engine = cluster.engine()
    good_args = cluster.vllm_args()
    with pytest.raises(EngineStartError) as info:
        engine.set_flag(*BAD_FLAG, timeout_s=30)
    message = str(info.value)
    assert "--kv-cache-dtype fp4 added" in message
    assert "CrashLoopBackOff" in message and "Rolled back to the last good configuration" in message
    assert "Back-off restarting failed container vllm" in info.value.log_excerpt  # the pod's events
    assert "invalid choice: 'fp4'" in info.value.log_excerpt  # its log
    assert "[--max-num-seqs" not in info.value.log_excerpt  # argparse's usage block is left out
    assert cluster.vllm_args() == good_args
    patches = [c for c in cluster.calls() if c[0] == "patch" and "--type=json" in c]
    assert len(patches) == 2  # the change, then the rollback
    rollback = json.loads(patches[1][patches[1].index("-p") + 1])
    assert rollback[-1] == {"op": "add", "path": "/spec/template/spec/containers/0/args", "value": good_args}
    newest = cluster.state()["pods"][-1]
    assert newest["x-fake-scenario"] == "ready"
    assert engine.is_ready()


def test_rollback_goes_to_the_last_good_config_another_kernel_recorded(cluster):
    cluster.engine().set_flag("--max-num-seqs", 16, timeout_s=30)  # kernel 1: a good change, recorded
    state = cluster.state()  # then someone patches the args by hand (still a working engine)
    args = container(state["deployments"]["vllm"], "vllm")["args"]
    args[args.index("--max-model-len") + 1] = "4096"
    cluster.write(state)
    kernel2 = cluster.engine()
    with pytest.raises(EngineStartError, match="Rolled back"):
        kernel2.set_flag(*BAD_FLAG, timeout_s=30)
    assert flag_value(cluster.vllm_args(), "--max-num-seqs") == "16"
    assert flag_value(cluster.vllm_args(), "--max-model-len") == "8192"


def test_a_pod_that_never_becomes_ready_is_rolled_back_at_the_deadline(cluster):
    engine = cluster.engine()
    with pytest.raises(EngineStartError) as info:
        engine.set_flag(SLOW_FLAG, timeout_s=2)
    assert f"{SLOW_FLAG} added failed: the new pod was not ready within 2 s" in str(info.value)
    assert "Startup probe failed" in info.value.log_excerpt
    assert SLOW_FLAG not in cluster.vllm_args()


def test_a_model_the_endpoint_does_not_list_is_rolled_back(cluster):
    engine = cluster.engine()
    with pytest.raises(EngineStartError) as info:
        engine.switch_model("RedHatAI/Qwen3-4B-FP8-dynamic", timeout_s=30)
    assert "the engine serves ['Qwen/Qwen3-4B'], not 'RedHatAI/Qwen3-4B-FP8-dynamic'" in str(info.value)
    assert cluster.vllm_args()[:4] == ["--model", MODEL, "--served-model-name", MODEL]
    assert engine.model == MODEL


def test_connect_uses_model_name_and_refuses_one_the_deployment_does_not_serve_naming_the_served_one(cluster):
    assert connect(cluster.settings).model == MODEL
    with pytest.raises(EndpointError, match=r"'Qwen/Qwen3-8B' is not served at .*Served: \['Qwen/Qwen3-4B'\]"):
        connect(replace(cluster.settings, model="Qwen/Qwen3-8B"))  # not the Deployment's model in its place
    assert cluster.vllm_args()[:4] == ["--model", MODEL, "--served-model-name", MODEL]  # and nothing was changed


def test_a_configuration_that_starts_but_cannot_generate_is_rolled_back(cluster):
    engine = cluster.engine()
    cluster.server.completion_statuses = [500, 200]  # the new pod lists the model, then fails its first token
    with pytest.raises(EngineStartError) as info:
        engine.set_flag("--kv-cache-dtype", "fp8", timeout_s=30)
    assert "could not generate a token (HTTP 500: EngineCore encountered an issue.)" in str(info.value)
    assert "Rolled back to the last good configuration" in str(info.value)
    assert "--kv-cache-dtype" not in cluster.vllm_args() and engine.config().served_name == MODEL
    assert [p["max_tokens"] for p in cluster.server.completion_payloads] == [1, 1]


def test_kubectl_errors_say_what_to_check(cluster, monkeypatch):
    state = cluster.state()
    state["forbid"] = ["patch"]
    cluster.write(state)
    with pytest.raises(EngineError, match="Role does not allow this"):
        cluster.engine().set_flag("--max-num-seqs", 8, timeout_s=5)
    state["forbid"] = []
    cluster.write(state)
    engine = cluster.engine()
    stale = engine._get()  # read, then another kernel changes the args before this one patches
    state["deployments"]["vllm"]["spec"]["template"]["spec"]["containers"][0]["args"].append("--enforce-eager")
    cluster.write(state)
    monkeypatch.setattr(engine, "_get", lambda: stale)
    with pytest.raises(EngineError, match="The Deployment changed since it was read"):
        engine.set_flag("--max-num-seqs", 8, timeout_s=5)
    assert cluster.vllm_args()[-1] == "--enforce-eager"  # the other kernel's change stands
    monkeypatch.setenv(ke.DEPLOYMENT_ENV, "engine")
    with pytest.raises(EngineError, match="set WORKSHOP_ENGINE_DEPLOYMENT"):
        cluster.engine().config()


# ---------------------------------------------------------------- namespaced, within the Role, no secrets

# What each kubectl command needs from the API: (API group, resource, verbs).
NEEDS = {
    ("get", "deployment"): [("apps", "deployments", {"get"})],
    ("patch", "deployment"): [("apps", "deployments", {"get", "patch"})],
    ("rollout", "status"): [("apps", "deployments", {"get", "list", "watch"})],
    ("rollout", "restart"): [("apps", "deployments", {"get", "patch"})],
    ("get", "pods"): [("", "pods", {"list"})],
    ("get", "events"): [("", "events", {"list"})],
    ("logs",): [("", "pods", {"get"}), ("", "pods/log", {"get"})],
}


def test_every_call_is_namespaced_and_allowed_by_the_participant_role(cluster):
    engine = cluster.engine()
    engine.set_flag("--max-num-seqs", 64, timeout_s=30)
    with pytest.raises(EngineStartError):
        engine.set_flag(*BAD_FLAG, timeout_s=30)
    engine.logs()
    engine.restart(timeout_s=30)
    engine.stop()
    calls = cluster.calls()
    assert len(calls) > 20
    role = next(d for d in yaml.safe_load_all((K8S_DIR / "base" / "rbac.yaml").read_text()) if d["kind"] == "Role")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    for call in calls:
        assert call[call.index("-n") + 1] == NS, call
        assert not {"-A", "--all-namespaces"} & set(call), call
        key = next(k for k in NEEDS if tuple(call[:len(k)]) == k)
        for group, resource, verbs in NEEDS[key]:
            assert {(group, resource, v) for v in verbs} <= granted, (call, resource)
        assert not {"secret", "secrets", "node", "nodes", "namespace", "namespaces"} & set(call), call


def test_no_secret_reaches_the_output_the_commands_or_the_annotation(cluster, capsys):
    state = cluster.state()
    state["log_extra"] = [f"DEBUG api key in use: {SECRET}"]  # a log that leaks the key
    cluster.write(state)
    engine = cluster.engine()
    with pytest.raises(EngineStartError) as info:
        engine.set_flag(*BAD_FLAG, timeout_s=30)
    assert "api key in use: ***" in info.value.log_excerpt
    shown = [str(info.value), engine.logs(), json.dumps(engine.status()), capsys.readouterr().out,
             json.dumps(cluster.calls()), json.dumps(cluster.deployment())]
    assert not [text for text in shown if SECRET in text]


# ---------------------------------------------------------------- the CPU translation, advice, restarts

def test_the_cpu_translation_table_maps_the_clusters_line_for_vllms_cpu_build():
    from helpers.core.vllm_args import CPU_KV_CACHE_BYTES, cpu_translation_table, translate_for_cpu

    gpu = ["--model", MODEL, "--served-model-name", MODEL, "--max-model-len", "8192", "--gpu-memory-utilization",
           "0.45", "--reasoning-parser", "qwen3", "--speculative-config",
           json.dumps({"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 3})]
    cpu = translate_for_cpu(gpu, "/kit/models")
    assert cpu[:4] == ["--model", "/kit/models/tiny-agent", "--served-model-name", MODEL]  # clients see the hub id
    assert flag_value(cpu, "--kv-cache-memory-bytes") == str(CPU_KV_CACHE_BYTES // 2)  # half the baseline share
    assert flag_value(cpu, "--gpu-memory-utilization") is None and flag_value(cpu, "--reasoning-parser") is None
    assert flag_value(cpu, "--max-model-len") == "4096" and cpu[-1] == "--enforce-eager"
    assert json.loads(flag_value(cpu, "--speculative-config"))["model"] == "/kit/models/tiny-draft"
    other = translate_for_cpu(["--model", "Qwen/Qwen3-8B", "--max-model-len", "2048"], "/kit/models")
    assert other[:2] == ["--model", "Qwen/Qwen3-8B"] and flag_value(other, "--max-model-len") == "2048"  # kept as is
    rows = cpu_translation_table()
    assert {"Qwen/Qwen3-4B", "RedHatAI/Qwen3-4B-FP8-dynamic", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-30B-A3B"} <= {r[0] for r in rows}


def test_each_failed_change_gets_one_sentence_that_says_what_to_do():
    before = EngineConfig(MODEL, MODEL, ("--max-num-seqs", "32"))
    flag = replace(before, args=("--max-num-seqs", "8"))
    other = replace(before, model="Qwen/Qwen3-0.6B", served_name="Qwen/Qwen3-0.6B")
    assert "give it longer than 5 s" in ke.failure_advice("the new pod was not ready within 5 s", "", flag, before, 5)
    assert "not in the room's download" in ke.failure_advice(
        "container vllm is in CrashLoopBackOff", "huggingface_hub.errors.LocalEntryNotFoundError: ...", other, before, 60)
    assert "change or remove that flag" in ke.failure_advice("container vllm is in CrashLoopBackOff", "invalid choice",
                                                             flag, before, 60)


def test_a_model_the_room_does_not_download_is_refused_before_any_patch(cluster):
    engine = cluster.engine()
    with pytest.raises(EngineError, match="Qwen/Qwen3-8B is not in the room's download, so the engine .offline. cannot "
                                          "serve it and nothing was changed: use one of Qwen/Qwen3-4B"):
        engine.switch_model("Qwen/Qwen3-8B", timeout_s=30)
    assert not [c for c in cluster.calls() if c[0] == "patch"] and not engine.restarts


def test_every_rollout_is_counted_with_its_outcome_and_a_refused_patch_is_not(cluster, tmp_path, monkeypatch):
    from helpers.core.restarts import RESTART_LOG_ENV, read_restarts

    log = tmp_path / "restarts.jsonl"
    monkeypatch.setenv(RESTART_LOG_ENV, str(log))
    engine = cluster.engine()
    engine.set_flag("--max-num-seqs", 64, timeout_s=30)
    with pytest.raises(EngineStartError):
        engine.set_flag(*BAD_FLAG, timeout_s=30)
    state = cluster.state()
    state["forbid"] = ["patch"]
    cluster.write(state)
    with pytest.raises(EngineError, match="Role does not allow this"):
        engine.set_flag("--max-num-seqs", 8, timeout_s=5)
    assert [r.outcome for r in engine.restarts] == ["ready", "failed", "ready"]  # the change, the bad one, the way back
    assert read_restarts(log) == engine.restarts
    assert engine.restarts[0].change == "--max-num-seqs 32 -> 64" and engine.restarts[2].change.startswith("back to")
