"""The engine as the participant's Kubernetes Deployment, behind the same interface as the local one.

``KubernetesEngine`` is the ``k8s`` profile's backend. A change of flags, environment or model:

1. reads the Deployment (``kubectl get deployment vllm -n NS -o json``) and finds the vLLM container;
2. patches only that container's ``args`` (and ``env`` when it changed) with a JSON patch that
   first tests the container's name at its index, so a reordered container list makes the patch
   fail instead of changing the wrong container;
3. waits for ``kubectl rollout status`` in short slices, checking the new pod between slices so a
   crash loop fails within seconds instead of at the deadline;
4. waits until ``/v1/models`` lists the served model.

When a step fails it shows the new pod's events and log tail, patches the last good configuration
back, waits for that rollout and raises ``EngineStartError``. The last good configuration is kept
in memory and in the Deployment's annotation ``workshop/last-good-config``, so a new notebook
kernel knows it. ``stop()`` scales the Deployment to 0 (the GPU is freed, the Deployment and the
model cache stay); ``restart()`` or any flag change scales it back to 1.

Every kubectl call carries ``-n NAMESPACE`` and touches only what the participant's Role grants
(k8s/base/rbac.yaml): deployments get/list/watch/patch, pods list, pods/log get, events list.
Secrets are never read: ``VLLM_API_KEY`` stays a ``secretKeyRef`` and the key is masked in logs.

Environment: ``NAMESPACE`` (required), ``WORKSHOP_ENGINE_DEPLOYMENT`` (default ``vllm``) and
``WORKSHOP_ENGINE_CONTAINER`` (default ``vllm``), the names in k8s/base/vllm.yaml. (Not ``VLLM_*``:
vLLM reads every ``VLLM_*`` variable as its own setting.)

Every rollout is counted (``restarts``, and ``$WORKSHOP_RESTART_LOG`` for ``workshop run``'s restart table,
helpers/core/restarts.py); a hub id the room does not download is refused before anything changes.

Not yet run against a live cluster: tests/test_k8s_engine.py drives it through a fake kubectl, and
tests/test_k8s_path_notebooks.py runs the notebooks through a kubectl double whose pod is a real local vLLM;
k8s/README.md, "The engine backend", lists the steps that verify it on one.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from helpers.engine.interface import GPU_START_TIMEOUT_S, Engine, EngineError, EngineStartError, NotServing, log_excerpt
from helpers.cluster.kubectl import CommandResult, ProvisionError, Runner, kubectl, run_kubectl
from helpers.core.models import room_models
from helpers.core.restarts import RESTART_LOG_ENV, Restart, record
from helpers.core.settings import Settings
from helpers.core.vllm_args import EngineConfig, describe_change, parse_args, server_args

DEFAULT_DEPLOYMENT = "vllm"  # k8s/base/vllm.yaml (a test keeps these equal)
DEFAULT_CONTAINER = "vllm"
DEPLOYMENT_ENV = "WORKSHOP_ENGINE_DEPLOYMENT"
CONTAINER_ENV = "WORKSHOP_ENGINE_CONTAINER"
LAST_GOOD_ANNOTATION = "workshop/last-good-config"
FIELD_MANAGER = "workshop-engine"  # shows in managedFields who changed the args
LOG_TAIL_LINES = 200
MAX_EVENTS = 10
TIMED_OUT = "timed out waiting for the condition"  # what `kubectl rollout status --timeout` prints
# A container waiting for one of these reasons will not become ready without a change.
FAILED_WAITING_REASONS = frozenset({"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                                    "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


# ---------------------------------------------------------------- container env (pure functions)

def literal_env(env: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
    """The container's plain ``name: value`` variables; references (Secrets, ConfigMaps) are left out, unresolved."""
    return tuple(sorted((e["name"], str(e.get("value", ""))) for e in env if "valueFrom" not in e))


def merged_env(env: Sequence[Mapping[str, Any]], wanted: Mapping[str, str]) -> list[dict[str, Any]]:
    """The container's env list with its plain variables set to ``wanted``; references are kept as they are."""
    referenced = sorted(e["name"] for e in env if "valueFrom" in e and e["name"] in wanted)
    if referenced:
        raise EngineError(f"{', '.join(referenced)} comes from a ConfigMap or Secret reference in the Deployment, "
                          "not from a plain value: change it there (ask your instructor), not with set_env.")
    out: list[dict[str, Any]] = []
    for entry in env:
        if "valueFrom" in entry:
            out.append(dict(entry))
        elif entry["name"] in wanted:
            out.append({"name": entry["name"], "value": wanted[entry["name"]]})
    present = {e["name"] for e in out}
    out += [{"name": k, "value": v} for k, v in sorted(wanted.items()) if k not in present]
    return out


# ---------------------------------------------------------------- pods and events (pure functions)

def newest_pod(pods: Sequence[Mapping[str, Any]], exclude: set[str] | frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """The most recently created pod that is not being deleted and not in ``exclude``."""
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp") and p["metadata"]["name"] not in exclude]
    return dict(max(live, key=lambda p: p["metadata"].get("creationTimestamp", ""))) if live else None


def pod_failure(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(why, container) when the pod cannot become ready without a change (crash loop, image error), else None."""
    name = pod["metadata"]["name"]
    status = pod.get("status", {})
    for c in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
        reason = ((c.get("state") or {}).get("waiting") or {}).get("reason")
        if reason in FAILED_WAITING_REASONS:
            last = (c.get("lastState") or {}).get("terminated") or {}
            code = f", last exit code {last['exitCode']}" if "exitCode" in last else ""
            return f"container {c['name']} of pod {name} is in {reason} ({c.get('restartCount', 0)} restarts{code})", c["name"]
    if status.get("phase") == "Failed":
        return f"pod {name} failed ({status.get('reason') or status.get('message') or 'no reason given'})", ""
    return None


def format_events(listing: Mapping[str, Any], limit: int = MAX_EVENTS) -> str:
    """The last events of a ``kubectl get events -o json`` listing, one line each: type, reason (xN), message."""
    def when(e: Mapping[str, Any]) -> str:
        return e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp") or ""

    lines = []
    for e in sorted(listing.get("items", []), key=when)[-limit:]:
        count = e.get("count") or (e.get("series") or {}).get("count") or 1
        times = f" (x{count})" if count > 1 else ""
        lines.append(f"{e.get('type', '')} {e.get('reason', '')}{times}: {e.get('message', '').strip()}")
    return "\n".join(lines)


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")  # org/name: a model the engine would look for in the room's download
# What the engine pod's log says when vLLM, offline, finds no copy of a hub model (huggingface_hub's errors)
NOT_DOWNLOADED = re.compile(r"(LocalEntryNotFoundError|offline mode|HF_HUB_OFFLINE|does not appear to have|"
                            r"couldn't connect to|Cannot find an appropriate cached snapshot|not a local folder)", re.I)


def failure_advice(reason: str, excerpt: str, config: EngineConfig, before: EngineConfig, timeout_s: float) -> str:
    """One sentence that says what to do after a failed change (the engine is back on its last good configuration)."""
    if config.model != before.model and (NOT_DOWNLOADED.search(excerpt) or "serves" in reason):
        return (f"{config.model} is not in the room's download (the engine runs offline, from the models your instructor "
                "downloaded: PREDOWNLOAD_MODELS in k8s/base/kustomization.yaml): use one of those, or ask your "
                "instructor to add it.")
    if "not ready within" in reason:
        return (f"If it was still starting, give it longer than {timeout_s:.0f} s (timeout_s=...; a first start on a GPU "
                "compiles for minutes); otherwise engine.logs() shows where it stopped.")
    return "The log lines below say what vLLM refused: change or remove that flag and run the cell again."


class _RolloutFailed(Exception):
    """The new pods did not become ready; ``pod`` is the newest new pod, ``container`` the one that failed."""

    def __init__(self, reason: str, pod: Mapping[str, Any] | None = None, container: str = "") -> None:
        super().__init__(reason)
        self.reason, self.pod, self.container = reason, pod, container


# ---------------------------------------------------------------- the backend

class KubernetesEngine(Engine):
    """The participant's vLLM Deployment, changed with namespaced kubectl calls."""

    rollout_slice_s = 10.0  # one `rollout status` wait; between two, the new pod is checked for a crash loop
    ready_poll_s = 2.0  # between two /v1/models requests

    def __init__(self, settings: Settings, runner: Runner | None = None, deployment: str | None = None,
                 container: str | None = None) -> None:
        if not settings.namespace:
            raise EngineError("The k8s profile needs NAMESPACE, the namespace of your engine (your notebook pod "
                              "sets it): export NAMESPACE=<your namespace> and restart the kernel.")
        super().__init__(settings)
        self.namespace = settings.namespace
        self.deployment = deployment or os.environ.get(DEPLOYMENT_ENV) or DEFAULT_DEPLOYMENT
        self.container = container or os.environ.get(CONTAINER_ENV) or DEFAULT_CONTAINER
        self._runner = runner  # None: helpers.cluster.kubectl.run_kubectl, the real kubectl
        self._current: EngineConfig | None = None
        self._last_good: EngineConfig | None = None
        self._rolled = False  # set once a change reached the Deployment (a rollout began)
        self.restarts: list[Restart] = []  # every rollout this engine made: the change, its seconds, its outcome

    # kubectl, always in the participant's namespace
    def _run(self, *args: str) -> CommandResult:
        """Run kubectl with ``-n NAMESPACE``; the exit code is the caller's to judge."""
        try:
            return (self._runner or run_kubectl)([*args, "-n", self.namespace])
        except ProvisionError as err:  # kubectl missing, or not answering
            raise EngineError(str(err)) from None

    def _out(self, *args: str) -> str:
        """Run kubectl with ``-n NAMESPACE``; its stdout, or EngineError with what to check."""
        try:
            return kubectl([*args, "-n", self.namespace], self._runner)
        except ProvisionError as err:
            text = str(err)
            if "NotFound" in text and "deployment" in text:
                text += (f". Is the engine Deployment named {self.deployment!r} in namespace {self.namespace!r}? "
                         f"`kubectl get deployments -n {self.namespace}` lists them; set {DEPLOYMENT_ENV} if it differs.")
            elif "Forbidden" in text:
                text += ". Your ServiceAccount's Role does not allow this: ask your instructor (k8s/base/rbac.yaml)."
            elif args[0] == "patch" and ("test failed" in text or "request is invalid" in text):
                text += (". The Deployment changed since it was read (another notebook kernel, or kubectl by hand?): "
                         "nothing was changed; run the cell again.")
            raise EngineError(text) from None

    def _get(self) -> dict[str, Any]:
        return json.loads(self._out("get", "deployment", self.deployment, "-o", "json"))

    def _find_container(self, deployment: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        containers = deployment["spec"]["template"]["spec"]["containers"]
        for index, c in enumerate(containers):
            if c["name"] == self.container:
                return index, c
        raise EngineError(f"Deployment {self.deployment} has no container {self.container!r} (it has "
                          f"{', '.join(c['name'] for c in containers)}): set {CONTAINER_ENV} to the vLLM container's name.")

    def _config_of(self, deployment: Mapping[str, Any]) -> EngineConfig:
        _, c = self._find_container(deployment)
        model, served, args, _ = parse_args(c.get("args", []))
        if not model:
            raise EngineError(f"The {self.container} container of Deployment {self.deployment} names no model in its "
                              "args (--model M, or M first): put it there so flags can be changed from here.")
        return EngineConfig(model=model, served_name=served or model, args=args, env=literal_env(c.get("env", [])))

    def _selector(self, deployment: Mapping[str, Any]) -> str:
        labels = deployment["spec"]["selector"].get("matchLabels", {})
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

    def _pods(self, selector: str) -> list[dict[str, Any]]:
        return json.loads(self._out("get", "pods", "-l", selector, "-o", "json")).get("items", [])

    def _redact(self, text: str) -> str:
        key = self.settings.api_key
        return text.replace(key, "***") if key else text

    # the interface
    def config(self) -> EngineConfig:
        self._current = self._config_of(self._get())
        return self._current

    @property
    def model(self) -> str:
        """The served model name, as last read from the Deployment (kept current by apply)."""
        return (self._current or self.config()).served_name

    def last_good(self, deployment: Mapping[str, Any] | None = None) -> EngineConfig | None:
        """The last configuration that became ready: the Deployment's annotation, else this kernel's memory."""
        deployment = deployment or self._get()
        text = (deployment["metadata"].get("annotations") or {}).get(LAST_GOOD_ANNOTATION)
        if text:
            try:
                return EngineConfig.from_json(json.loads(text))
            except (ValueError, KeyError, TypeError):
                pass
        return self._last_good

    def apply(self, config: EngineConfig, timeout_s: float | None = None) -> None:
        timeout_s = timeout_s or GPU_START_TIMEOUT_S
        deployment = self._get()
        before = self._config_of(deployment)
        good = self.last_good(deployment) or before
        change = describe_change(before, config)
        self._refuse_undownloaded(config, before)
        try:
            self._timed_roll_out(deployment, config, timeout_s, change, "failed")
        except _RolloutFailed as failure:
            excerpt = self._failure_excerpt(failure)
            advice = failure_advice(failure.reason, excerpt, config, before, timeout_s)
            if good == config:
                raise EngineStartError(f"The engine did not become ready on this configuration ({failure.reason}), and "
                                       "there is no other known-good one to go back to. Ask your instructor to run "
                                       f"`workshop reset {self.namespace}`.", excerpt) from None
            try:  # the way back gets a whole start's time, whatever the change was given
                self._timed_roll_out(self._get(), good, max(timeout_s, GPU_START_TIMEOUT_S),
                                     f"back to the last good configuration after: {change}", "rollback failed")
            except _RolloutFailed as again:
                raise EngineStartError(
                    f"Restarting with {change} failed ({failure.reason}), and rolling back to the last good configuration "
                    f"failed too ({again.reason}). Ask your instructor to run `workshop reset {self.namespace}`.",
                    excerpt) from None
            self._remember(good)
            raise EngineStartError(
                f"Restarting with {change} failed: {failure.reason}. Rolled back to the last good configuration, which is "
                f"ready again ({good.served_name}: {' '.join(good.args)}). {advice}", excerpt) from None
        self._remember(config)

    def _timed_roll_out(self, deployment: Mapping[str, Any], config: EngineConfig, timeout_s: float, change: str,
                        failed: str) -> None:
        """``_roll_out``, counted as one restart (``restarts`` and ``$WORKSHOP_RESTART_LOG``) with its time."""
        started, clock = time.time(), time.monotonic()
        outcome, self._rolled = failed, False
        try:
            self._roll_out(deployment, config, timeout_s)
            outcome = "ready"
        finally:
            if self._rolled:  # a patch the API server refused restarted nothing
                self.count_restart(Restart(started, change, round(time.monotonic() - clock, 1), outcome))

    def count_restart(self, restart: Restart) -> None:
        """Count one rollout (also one made with kubectl apply, helpers/engine/k8s_change.py)."""
        self.restarts.append(restart)
        log = os.environ.get(RESTART_LOG_ENV)
        if log:
            record(log, restart)

    def _refuse_undownloaded(self, config: EngineConfig, before: EngineConfig) -> None:
        """A hub id the room's download does not fetch cannot start (the engine runs offline): say so, change nothing."""
        room = room_models(self.settings)
        if config.model != before.model and HUB_ID.fullmatch(config.model) and config.model not in room:
            raise EngineError(f"{config.model} is not in the room's download, so the engine (offline) cannot serve it and "
                              f"nothing was changed: use one of {', '.join(room)}, or ask your instructor to add it "
                              "(PREDOWNLOAD_EXTRA_MODELS, `workshop provision --with-moe` for the MoE).")

    def logs(self, lines: int = 50) -> str:
        pod = newest_pod(self._pods(self._selector(self._get())))
        if pod is None:
            return f"(no pod of Deployment {self.deployment} in {self.namespace}: stopped? engine.restart() starts it)"
        return self._log_tail(pod["metadata"]["name"], self.container, lines)

    def stop(self, timeout_s: float = 120.0) -> None:
        """Scale the Deployment to 0 and wait until its pods are gone; ``restart()`` brings it back."""
        deployment = self._get()
        selector = self._selector(deployment)
        self._out("patch", "deployment", self.deployment, "--type=json", f"--field-manager={FIELD_MANAGER}",
                  "-p", json.dumps([{"op": "replace", "path": "/spec/replicas", "value": 0}]))
        deadline = time.monotonic() + timeout_s
        while self._pods(selector):
            if time.monotonic() > deadline:
                raise EngineError(f"The engine's pods were still terminating after {timeout_s:.0f} s: "
                                  f"check `kubectl get pods -n {self.namespace}`.")
            time.sleep(self.ready_poll_s)

    # for the manifest exercise (helpers/engine/k8s_change.py): the live object, and adopting a change made with kubectl
    def live_deployment(self) -> dict[str, Any]:
        """The Deployment as the API server has it now (``kubectl get deployment -o json``)."""
        return self._get()

    def adopt(self, config: EngineConfig) -> None:
        """Record ``config``, applied and ready by other means (``kubectl apply``), as the last good one."""
        self._remember(config)

    def redact(self, text: str) -> str:
        """``text`` with the engine's API key masked."""
        return self._redact(text)

    # how a change is made
    def patch_ops(self, deployment: Mapping[str, Any], config: EngineConfig) -> list[dict[str, Any]]:
        """The JSON patch that puts ``config`` into the vLLM container (empty when nothing would change)."""
        index, c = self._find_container(deployment)
        path = f"/spec/template/spec/containers/{index}"
        _, _, _, positional = parse_args(c.get("args", []))
        ops: list[dict[str, Any]] = []
        args = server_args(config, positional)
        if args != c.get("args"):
            ops.append({"op": "add", "path": f"{path}/args", "value": args})  # add replaces an existing member
        env = c.get("env", [])
        if literal_env(env) != tuple(sorted(config.env)):
            ops.append({"op": "add", "path": f"{path}/env", "value": merged_env(env, dict(config.env))})
        if deployment["spec"].get("replicas", 1) == 0:
            ops.append({"op": "replace", "path": "/spec/replicas", "value": 1})
        if not ops:
            return []
        guard = [{"op": "test", "path": f"{path}/name", "value": self.container}]
        if "args" in c:  # compare-and-swap: fail if the args changed since they were read
            guard.append({"op": "test", "path": f"{path}/args", "value": c["args"]})
        return guard + ops

    def _roll_out(self, deployment: Mapping[str, Any], config: EngineConfig, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        selector = self._selector(deployment)
        old_pods = {p["metadata"]["name"] for p in self._pods(selector)}
        ops = self.patch_ops(deployment, config)
        if ops:
            self._out("patch", "deployment", self.deployment, "--type=json", f"--field-manager={FIELD_MANAGER}",
                      "-p", json.dumps(ops))
        else:
            self._out("rollout", "restart", f"deployment/{self.deployment}")
        self._rolled = True
        self._wait_rollout(selector, old_pods, deadline, timeout_s)
        self._wait_served(config.served_name, selector, old_pods, deadline, timeout_s)

    def _wait_rollout(self, selector: str, old_pods: set[str], deadline: float, timeout_s: float) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pod = newest_pod(self._pods(selector), old_pods)
                raise _RolloutFailed(f"the new pod was not ready within {timeout_s:.0f} s", pod, self.container)
            wait_s = max(1, int(min(self.rollout_slice_s, remaining)))
            result = self._run("rollout", "status", f"deployment/{self.deployment}", f"--timeout={wait_s}s")
            if result.returncode == 0:
                return
            message = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
            pod = newest_pod(self._pods(selector), old_pods)
            if TIMED_OUT not in message and "progress deadline" not in message:
                raise EngineError(f"kubectl rollout status failed: {message}. The Deployment was patched; check "
                                  f"`kubectl rollout status deployment/{self.deployment} -n {self.namespace}`.")
            if "progress deadline" in message:
                raise _RolloutFailed(message.removeprefix("error: "), pod, self.container)
            failure = pod_failure(pod) if pod else None
            if failure:
                raise _RolloutFailed(failure[0], pod, failure[1] or self.container)

    def _wait_served(self, expected: str, selector: str, old_pods: set[str], deadline: float, timeout_s: float) -> None:
        try:
            self.wait_serving(expected, deadline, timeout_s)
        except NotServing as err:  # Recreate: once rolled out, only the new pod answers
            raise _RolloutFailed(err.reason, newest_pod(self._pods(selector), old_pods), self.container) from None

    def _remember(self, config: EngineConfig) -> None:
        """Keep ``config`` as the last good one: in memory and in the Deployment's annotation."""
        self._current = self._last_good = config
        patch = {"metadata": {"annotations": {LAST_GOOD_ANNOTATION: json.dumps(config.to_json(), sort_keys=True)}}}
        self._out("patch", "deployment", self.deployment, "--type=merge", f"--field-manager={FIELD_MANAGER}",
                  "-p", json.dumps(patch))

    # what a failure shows
    def _log_tail(self, pod: str, container: str, lines: int) -> str:
        result = self._run("logs", pod, "-c", container, f"--tail={lines}")
        if result.returncode != 0 or not result.stdout.strip():
            previous = self._run("logs", pod, "-c", container, f"--tail={lines}", "--previous")
            if previous.returncode == 0:
                result = previous
        text = result.stdout if result.returncode == 0 else (result.stderr.strip() or "(no log)")
        return self._redact(text)

    def _failure_excerpt(self, failure: _RolloutFailed) -> str:
        """The failed pod's events and the relevant lines of its log (or the namespace's warnings without a pod)."""
        if failure.pod is None:
            events = json.loads(self._out("get", "events", "--field-selector", "type=Warning", "-o", "json"))
            return self._redact(f"no new pod was created; recent warnings in {self.namespace}:\n{format_events(events)}")
        pod = failure.pod["metadata"]["name"]
        events = json.loads(self._out("get", "events", "--field-selector", f"involvedObject.name={pod}", "-o", "json"))
        container = failure.container or self.container
        log = log_excerpt(self._log_tail(pod, container, LOG_TAIL_LINES))
        return self._redact(f"events of pod {pod}:\n{format_events(events)}\n"
                            f"log of pod {pod}, container {container}:\n{log}")

