"""The manifest exercise without a cluster: the patch, the kustomize directory, the kubectl commands, and the
local branch (the change through the engine interface, the patch shown)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from typing import Any

import pytest
import yaml

from helpers.engine import k8s_change as mc
from fakes import RecordingEngine
from helpers.cluster.overlays import K8S_DIR
from helpers.core.vllm_args import EngineConfig, flag_value, with_flag

CONFIG = EngineConfig(model="/home/me/models/tiny-agent", served_name="tiny-agent",
                      args=("--max-model-len", "4096", "--max-num-seqs", "16"))


def test_the_patch_sets_only_the_vllm_containers_args():
    patch = mc.deployment_patch(replace(CONFIG, model="Qwen/Qwen3-4B", served_name="Qwen/Qwen3-4B"))
    assert patch["kind"] == "Deployment" and patch["metadata"] == {"name": "vllm"}
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert container == {"name": "vllm", "args": ["--model", "Qwen/Qwen3-4B", "--served-model-name", "Qwen/Qwen3-4B",
                                                  "--max-model-len", "4096", "--max-num-seqs", "16"]}
    positional = mc.deployment_patch(CONFIG, "engine", "server", positional=True)
    assert positional["spec"]["template"]["spec"]["containers"][0]["args"][0] == CONFIG.model
    assert mc.kustomization() == {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                  "resources": ["deployment.yaml"],
                                  "patches": [{"path": "patch.yaml", "target": {"kind": "Deployment", "name": "vllm"}}]}


def test_a_live_object_loses_what_the_server_owns():
    live = {"apiVersion": "apps/v1", "kind": "Deployment", "status": {"replicas": 1},
            "metadata": {"name": "vllm", "namespace": "ws-01", "resourceVersion": "42", "uid": "u", "generation": 3,
                         "managedFields": [{}], "creationTimestamp": "t", "labels": {"a": "b"},
                         "annotations": {"deployment.kubernetes.io/revision": "3", "keep": "me"}},
            "spec": {"replicas": 1}}
    clean = mc.clean_live_object(live)
    assert clean["metadata"] == {"name": "vllm", "namespace": "ws-01", "labels": {"a": "b"}, "annotations": {"keep": "me"}}
    assert "status" not in clean and live["metadata"]["uid"] == "u"  # the input is left alone


def test_the_kubectl_commands_are_namespaced_and_in_order():
    cmds = mc.kubectl_commands("ws-07", "/tmp/change", "vllm", 900)
    assert list(cmds) == ["diff", "apply", "rollout"]
    assert cmds["diff"] == ["kubectl", "diff", "-k", "/tmp/change", "-n", "ws-07"]
    assert cmds["apply"][:6] == ["kubectl", "apply", "-k", "/tmp/change", "-n", "ws-07"]
    assert cmds["apply"][6] == f"--field-manager={mc.FIELD_MANAGER}"
    assert cmds["rollout"] == ["kubectl", "rollout", "status", "deployment/vllm", "-n", "ws-07", "--timeout=900s", "--watch"]
    assert mc.diff_outcome(0) == "no differences" and mc.diff_outcome(1) == "differences"
    with pytest.raises(RuntimeError, match=r"exit code 2\): forbidden"):
        mc.diff_outcome(2, "forbidden")


def test_the_local_branch_changes_the_flag_through_the_engine_and_shows_the_cluster_patch():
    engine = RecordingEngine(CONFIG)
    change = mc.change_one_flag(engine, "--max-num-seqs", 32, model="Qwen/Qwen3-4B")
    assert not change.on_cluster and flag_value(engine.config().args, "--max-num-seqs") == "32"
    assert len(engine.applied) == 1 and change.changed_flags() == ["--max-num-seqs"]
    shown = yaml.safe_load(change.patch_yaml)
    args = shown["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--model", "Qwen/Qwen3-4B"] and args[-2:] == ["--max-num-seqs", "32"]
    assert "/home/me" not in change.describe()  # the cluster's model, never this machine's path
    assert "kubectl diff -k" in change.describe() and "engine.set_flag" in change.describe()


def test_changed_flags_sees_an_added_and_a_removed_flag():
    after = replace(CONFIG, args=with_flag(with_flag(CONFIG.args, "--max-num-seqs", None), "--enforce-eager", True))
    change = mc.ManifestChange("x", 1, CONFIG, after, "", "", {}, False)
    assert change.changed_flags() == ["--enforce-eager", "--max-num-seqs"]


@pytest.mark.skipif(not (shutil.which("kubectl") or shutil.which("kustomize")),
                    reason="neither kubectl nor kustomize is installed: cannot render offline")
def test_kustomize_renders_the_change_directory_with_the_new_flag(tmp_path):
    live: dict[str, Any] = yaml.safe_load((K8S_DIR / "base" / "vllm.yaml").read_text().split("\n---")[0])
    live["metadata"].update(namespace="ws-01", resourceVersion="7")
    vllm = next(c for c in live["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
    before = EngineConfig(model="Qwen/Qwen3-4B", served_name="Qwen/Qwen3-4B", args=tuple(vllm["args"][4:]))
    after = replace(before, args=with_flag(before.args, "--max-num-seqs", 48))
    directory = mc.write_change_dir(tmp_path / "change", live, mc.deployment_patch(after))
    command = ["kustomize", "build"] if shutil.which("kustomize") else ["kubectl", "kustomize"]
    out = subprocess.run([*command, str(directory)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    out = out.stdout
    (rendered,) = [d for d in yaml.safe_load_all(out) if d]
    containers = rendered["spec"]["template"]["spec"]["containers"]
    got = next(c for c in containers if c["name"] == "vllm")
    assert flag_value(got["args"], "--max-num-seqs") == "48" and got["image"] == vllm["image"]
    assert len(containers) == len(live["spec"]["template"]["spec"]["containers"])  # merged by name, not replaced
    assert "resourceVersion" not in rendered["metadata"]
