"""One flag changed the way a cluster changes it: a kustomize patch, ``kubectl diff``, ``kubectl apply``,
``kubectl rollout status``; on the local engine, the same change through the engine interface with the
manifest patch shown.

``change_one_flag`` is the one call a notebook makes; the branch on where the engine runs is here, not in
the notebook. Both branches build the patch from the same object (``deployment_patch``), so the text shown
on a laptop is what the cluster would apply. On the cluster:

1. the live Deployment is read and cleaned of what the server owns (status, resourceVersion, ...), and
   written with the patch and a ``kustomization.yaml`` into a directory;
2. ``kubectl diff -k DIR`` shows what would change (exit code 1 means "there are differences");
3. ``kubectl apply -k DIR`` applies it; ``kubectl rollout status`` is followed line by line;
4. the engine waits until ``/v1/models`` serves the model again.

The participant's Role (k8s/base/rbac.yaml) allows get and patch on Deployments, which is what a
client-side apply of an existing Deployment and a server-side dry run (``diff``) need.
"""

from __future__ import annotations

import copy
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import yaml

from helpers.core.vllm_args import EngineConfig, describe_change, flag_value, server_args, with_flag

if TYPE_CHECKING:
    from helpers.engine.interface import Engine
    from helpers.engine.k8s import KubernetesEngine

FIELD_MANAGER = "workshop-manifest-exercise"  # shows in managedFields who applied the change
PATCH_FILE = "patch.yaml"
RESOURCE_FILE = "deployment.yaml"
# Set by the API server: a resource written back with these would be refused or fight the server.
SERVER_METADATA = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields", "selfLink")
SERVER_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration", "deployment.kubernetes.io/revision")


def deployment_patch(config: EngineConfig, deployment: str = "vllm", container: str = "vllm",
                     positional: bool = False) -> dict[str, Any]:
    """A strategic-merge patch (as a dict) that sets the vLLM container's args to ``config``: containers
    merge by name, so only this container's args change."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": deployment},
            "spec": {"template": {"spec": {"containers": [{"name": container,
                                                           "args": server_args(config, positional)}]}}}}


def kustomization(deployment: str = "vllm", resource: str = RESOURCE_FILE, patch: str = PATCH_FILE) -> dict[str, Any]:
    """The ``kustomization.yaml`` of the change: the Deployment as it runs, and the one patch on top (aimed at
    the Deployment by kind and name, whatever its namespace)."""
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": [resource],
            "patches": [{"path": patch, "target": {"kind": "Deployment", "name": deployment}}]}


def clean_live_object(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A live object (``kubectl get -o json``) without what the server owns, ready to be applied again."""
    out = copy.deepcopy(dict(obj))
    out.pop("status", None)
    meta = out.setdefault("metadata", {})
    for key in SERVER_METADATA:
        meta.pop(key, None)
    annotations = meta.get("annotations") or {}
    for key in SERVER_ANNOTATIONS:
        annotations.pop(key, None)
    if "annotations" in meta and not annotations:
        meta.pop("annotations")
    return out


def write_change_dir(directory: Path, live: Mapping[str, Any], patch: Mapping[str, Any], deployment: str = "vllm") -> Path:
    """Write the change as a kustomize directory: the live Deployment (cleaned), the patch, the kustomization."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RESOURCE_FILE).write_text(_dump(clean_live_object(live)))
    (directory / PATCH_FILE).write_text(_dump(dict(patch)))
    (directory / "kustomization.yaml").write_text(_dump(kustomization(deployment)))
    return directory


def kubectl_commands(namespace: str, directory: str | Path, deployment: str = "vllm",
                     timeout_s: int = 600) -> dict[str, list[str]]:
    """The three kubectl commands of the change, in order: diff, apply, rollout status (each namespaced)."""
    directory = str(directory)
    return {"diff": ["kubectl", "diff", "-k", directory, "-n", namespace],
            "apply": ["kubectl", "apply", "-k", directory, "-n", namespace, f"--field-manager={FIELD_MANAGER}"],
            "rollout": ["kubectl", "rollout", "status", f"deployment/{deployment}", "-n", namespace,
                        f"--timeout={int(timeout_s)}s", "--watch"]}


def diff_outcome(returncode: int, stderr: str = "") -> str:
    """``kubectl diff``'s exit code in words: 0 no differences, 1 differences, anything else an error."""
    if returncode == 0:
        return "no differences"
    if returncode == 1:
        return "differences"
    raise RuntimeError(f"kubectl diff failed (exit code {returncode}): {stderr.strip() or 'no message'}. Check "
                       "`kubectl auth can-i patch deployments` and `kubectl cluster-info`.")


@dataclass
class ManifestChange:
    """One flag change: the configurations before and after, the patch as applied or as it would be, and on
    a cluster what kubectl printed."""

    flag: str
    value: Any
    before: EngineConfig
    after: EngineConfig
    patch_yaml: str
    kustomization_yaml: str
    commands: dict[str, list[str]]
    on_cluster: bool
    diff: str = ""
    rollout: list[str] = field(default_factory=list)

    def changed_flags(self) -> list[str]:
        """The flags whose value differs between the rendered args before and after."""
        names = {a for a in (*self.before.args, *self.after.args) if a.startswith("--")}
        return sorted(n for n in names if flag_value(self.before.args, n) != flag_value(self.after.args, n))

    def describe(self) -> str:
        """What was done (cluster) or what the cluster would do (local), with the patch and the commands."""
        how = ("on the cluster: kubectl diff, apply and rollout status ran" if self.on_cluster else
               "on the local engine through the engine interface (engine.set_flag); on a cluster the same "
               "change is the patch below, applied with the commands below")
        lines = [f"Changed {describe_change(self.before, self.after)} {how}.", "",
                 f"{PATCH_FILE}:", self.patch_yaml, "kustomization.yaml:", self.kustomization_yaml, "commands:"]
        lines += ["  " + " ".join(cmd) for cmd in self.commands.values()]
        if self.on_cluster:
            lines += ["", "kubectl diff:", self.diff or "(no differences)", "", "kubectl rollout status:", *self.rollout]
        return "\n".join(lines)


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def change_one_flag(engine: Engine, flag: str, value: Any, model: str | None = None,
                    show: Callable[[str], None] = print, base: EngineConfig | None = None) -> ManifestChange:
    """Change one vLLM flag of ``engine`` and return what was done: on the Kubernetes backend with kubectl
    diff/apply/rollout status; on any other, with ``engine.apply`` and the equivalent patch rendered for
    the cluster's ``model`` (None: the engine's own served name). ``base``: the configuration to change from
    (default: the one the engine runs), e.g. the last one kept when the engine still runs a candidate rolled back:
    one restart sets the flag back and the next one."""
    from helpers.engine.k8s import KubernetesEngine

    before = base or engine.config()
    after = replace(before, args=with_flag(before.args, flag, value))
    if isinstance(engine, KubernetesEngine):
        return _change_on_cluster(engine, flag, value, before, after, show)
    shown = replace(after, model=model or after.served_name, served_name=model or after.served_name)
    change = ManifestChange(flag, value, before, after, _dump(deployment_patch(shown)), _dump(kustomization()),
                            kubectl_commands("<your namespace>", "my-change/"), on_cluster=False)
    engine.apply(after)
    return change


def _change_on_cluster(engine: KubernetesEngine, flag: str, value: Any, before: EngineConfig, after: EngineConfig,
                       show: Callable[[str], None]) -> ManifestChange:
    """The cluster branch of ``change_one_flag`` (KubernetesEngine): kustomize directory, diff, apply, rollout."""
    from helpers.engine.interface import GPU_START_TIMEOUT_S, EngineStartError

    live = engine.live_deployment()
    containers = live["spec"]["template"]["spec"]["containers"]
    args = next((c.get("args", []) for c in containers if c["name"] == engine.container), [])
    positional = bool(args) and not args[0].startswith("--")
    patch = deployment_patch(after, engine.deployment, engine.container, positional)
    directory = write_change_dir(Path(tempfile.mkdtemp(prefix="manifest-change-")), live, patch,
                                 engine.deployment)
    commands = kubectl_commands(engine.namespace, directory, engine.deployment, int(GPU_START_TIMEOUT_S))
    change = ManifestChange(flag, value, before, after, _dump(patch), _dump(kustomization(engine.deployment)), commands,
                            on_cluster=True)
    try:
        return _roll_out_with_kubectl(engine, change, show)
    except EngineStartError:
        show(f"Going back to {' '.join(before.args)} through the engine interface...")
        engine.apply(before)  # the engine's own patch and rollout, with its crash-loop checks
        raise


def _roll_out_with_kubectl(engine: KubernetesEngine, change: ManifestChange, show: Callable[[str], None]) -> ManifestChange:
    """kubectl diff, apply and rollout status of a prepared ``change``, then wait until the model is served."""
    from helpers.engine.interface import EngineStartError

    commands, after = change.commands, change.after
    diff = subprocess.run(commands["diff"], capture_output=True, text=True, check=False)
    diff_outcome(diff.returncode, diff.stderr)
    change.diff = engine.redact(diff.stdout)
    show("kubectl diff:\n" + (change.diff or "(no differences)"))
    applied = subprocess.run(commands["apply"], capture_output=True, text=True, check=False)
    if applied.returncode != 0:
        raise EngineStartError(f"kubectl apply failed: {applied.stderr.strip()}. Nothing was rolled out.")
    show(applied.stdout.strip())
    started, clock, outcome = time.time(), time.monotonic(), "failed"
    try:
        _follow_rollout(engine, change, show)
        outcome = "ready"
    finally:  # a rollout made with kubectl apply is a restart too (the restart table)
        from helpers.core.restarts import Restart

        engine.count_restart(Restart(started, f"{describe_change(change.before, after)} (kubectl apply)",
                                     round(time.monotonic() - clock, 1), outcome))
    return change


def _follow_rollout(engine: KubernetesEngine, change: ManifestChange, show: Callable[[str], None]) -> None:
    """kubectl rollout status, line by line, then wait until the engine serves the changed configuration."""
    from helpers.engine.interface import GPU_START_TIMEOUT_S, EngineStartError, NotServing

    commands, after = change.commands, change.after
    with subprocess.Popen(commands["rollout"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout or []:  # one line per rollout step, as it happens
            change.rollout.append(line.rstrip())
            show(f"rollout: {line.rstrip()}")
    if proc.returncode != 0:
        raise EngineStartError(f"the rollout did not finish ({change.rollout[-1] if change.rollout else 'no output'}); "
                               f"`kubectl rollout undo deployment/{engine.deployment} -n {engine.namespace}` goes back.")
    try:
        engine.wait_serving(after.served_name, time.monotonic() + GPU_START_TIMEOUT_S, GPU_START_TIMEOUT_S)
    except NotServing as err:
        raise EngineStartError(f"rolled out, but the engine does not serve yet: {err.reason}") from None
    engine.adopt(after)
