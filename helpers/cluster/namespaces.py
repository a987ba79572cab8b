"""The participants' namespaces on the live cluster: apply the rendered overlays, show their status, reset one
participant, tear a workshop down.

``teardown`` deletes a namespace only when it carries the label and the annotation, is named
``<prefix>-NN`` (or ``<prefix>-models``, the room's download) for the ``--prefix`` given, and is no system
namespace (``SYSTEM_NAMESPACES``); then the workshop's PersistentVolumes (the models on the NFS export stay).
Every function builds a kubectl command and runs it through one ``runner`` (``run_kubectl`` when None;
tests pass a recorded fake). The overlays and their settings come from ``helpers.cluster.overlays``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from helpers.cluster import room
from helpers.cluster.kubectl import ProvisionError, Runner, kubectl
from helpers.cluster.overlays import (DEFAULT_OUT_DIR, DNS_LABEL, MANAGED_BY, MANAGED_BY_LABEL, PREFIX_LABEL,
                                      PROVISIONED_ANNOTATION, SYSTEM_NAMESPACES, is_system_namespace, load_workshop)

FIELD_MANAGER = "workshop-provision"


def apply_command(overlay_dir: Path | str) -> list[str]:
    """kubectl arguments that apply one overlay (server-side, taking back fields notebooks patched)."""
    return ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--force-conflicts", "-k", str(overlay_dir)]


def apply(out_dir: Path | str = DEFAULT_OUT_DIR, runner: Runner | None = None,
          namespaces: Iterable[str] | None = None) -> list[str]:
    """Apply the overlays under ``out_dir`` (all, the room's download first, or the given namespaces);
    return kubectl's summaries."""
    ws = load_workshop(out_dir)
    known = [room.models_namespace(ws.prefix), *ws.namespaces()]
    wanted = list(namespaces) if namespaces is not None else known
    unknown = [ns for ns in wanted if ns not in known]
    if unknown:
        raise ProvisionError(f"{', '.join(unknown)} not provisioned in {out_dir}: "
                             f"known are {', '.join(known)}")
    summaries = []
    for ns in wanted:
        out = kubectl(apply_command(Path(out_dir) / ns), runner)
        summaries.append(f"{ns}: {len(out.splitlines())} objects applied")
    return summaries


def _is_managed(obj: Mapping[str, Any]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY


def managed_selector(prefix: str | None = None) -> str:
    """The label selector of provisioned objects (of one workshop prefix, if given)."""
    return f"{MANAGED_BY_LABEL}={MANAGED_BY}" + (f",{PREFIX_LABEL}={prefix}" if prefix else "")


@dataclass(frozen=True)
class TeardownPlan:
    """What teardown deletes, what it leaves alone and why, and the workshops it found (their prefixes)."""

    prefix: str | None
    delete: list[str]
    skipped: dict[str, str] = field(default_factory=dict)  # namespace -> why teardown leaves it alone
    workshops: list[str] = field(default_factory=list)  # prefixes that `teardown --prefix P` would delete from


def _skip_reason(namespace: Mapping[str, Any], prefix: str | None) -> tuple[str | None, str | None]:
    """Why teardown leaves ``namespace`` alone (None: it deletes it), and the workshop it belongs to."""
    meta = namespace.get("metadata", {})
    name, labels, annotations = meta["name"], meta.get("labels") or {}, meta.get("annotations") or {}
    if is_system_namespace(name):
        return f"a system namespace: teardown never deletes {', '.join(SYSTEM_NAMESPACES)}", None
    if not _is_managed(namespace):
        return f"not labelled {MANAGED_BY_LABEL}={MANAGED_BY}", None
    if annotations.get(PROVISIONED_ANNOTATION) != MANAGED_BY:
        return (f"labelled, but without the annotation {PROVISIONED_ANNOTATION}={MANAGED_BY} that "
                "`workshop provision` sets (provisioned before it existed? run `workshop provision` again with "
                "the same flags)"), None
    own = labels.get(PREFIX_LABEL, "")
    if not own or not re.fullmatch(re.escape(own) + rf"-(\d{{2}}|{room.MODELS_SUFFIX})", name):
        return f"its name is not <prefix>-NN for its label {PREFIX_LABEL}={own}", None
    if prefix is None:
        return f"no --prefix given (workshop {own!r}: --prefix {own})", own
    if own != prefix:
        return f"workshop {own!r}, not {prefix!r}", own
    return None, own


def teardown(prefix: str | None = None, yes: bool = False, runner: Runner | None = None) -> TeardownPlan:
    """Plan which namespaces of workshop ``prefix`` to delete (and why others stay); delete them only if ``yes``.

    Without ``prefix`` nothing is deleted: the plan lists the workshops found, and ``yes`` is refused.
    """
    if prefix is not None and not DNS_LABEL.match(prefix):
        raise ProvisionError(f"--prefix {prefix!r} is not a namespace prefix (a lowercase DNS label such as ws): "
                             "pass the --prefix the workshop was provisioned with")
    if prefix is None and yes:
        raise ProvisionError("teardown --yes needs --prefix: it deletes one workshop at a time. Run `workshop "
                             "teardown` without --yes to list the workshops here, then `workshop teardown "
                             "--prefix NAME --yes`")
    listing = json.loads(kubectl(["get", "namespaces", "-l", managed_selector(), "-o", "json"], runner))
    delete, skipped, workshops = [], {}, set()
    for item in listing.get("items", []):
        reason, workshop = _skip_reason(item, prefix)
        if workshop:
            workshops.add(workshop)
        if reason is None:
            delete.append(item["metadata"]["name"])
        else:
            skipped[item["metadata"]["name"]] = reason
    delete.sort()
    if yes and delete:
        kubectl(["delete", "namespace", *delete, "--wait=false"], runner)
        # The claims go with their namespaces; their PersistentVolumes (cluster-wide, Retain) are the workshop's
        # too. Deleting them leaves the models on the NFS export for the next workshop.
        kubectl(["delete", "persistentvolume", "-l", managed_selector(prefix), "--wait=false"], runner)
    return TeardownPlan(prefix, delete, dict(sorted(skipped.items())), sorted(workshops))


def reset(namespace: str, out_dir: Path | str = DEFAULT_OUT_DIR, runner: Runner | None = None) -> None:
    """Re-apply one participant's overlay (undoing flag changes) and restart their engine; files are kept."""
    ws = load_workshop(out_dir)
    if namespace not in ws.namespaces():
        raise ProvisionError(f"{namespace!r} is not one of this workshop's namespaces ({ws.namespaces()[0]} ... "
                             f"{ws.namespaces()[-1]})")
    live = json.loads(kubectl(["get", "namespace", namespace, "-o", "json"], runner))
    if not _is_managed(live):
        raise ProvisionError(f"namespace {namespace} lacks the label {MANAGED_BY_LABEL}={MANAGED_BY}: "
                             "refusing to touch it")
    kubectl(apply_command(Path(out_dir) / namespace), runner)
    # Forget the notebooks' last good configuration (helpers.engine.k8s), so a later rollback returns to
    # the provisioned baseline and not to a flag set before the reset. A missing key is not an error.
    kubectl(["annotate", "deployment/vllm", "-n", namespace, "workshop/last-good-config-"], runner)
    kubectl(["rollout", "restart", "deployment/vllm", "-n", namespace], runner)


@dataclass(frozen=True)
class ParticipantStatus:
    """One participant's engine and notebook, as the instructor's status table shows them."""

    namespace: str
    engine: str
    notebook: str
    engine_restarts: int
    node: str


def _pod_state(pod: Mapping[str, Any]) -> str:
    """A short word for where a pod is: ready, starting, downloading models, or why it is stuck."""
    status = pod.get("status", {})
    for cond in status.get("conditions", []):
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"unschedulable: {cond.get('message', cond.get('reason', ''))[:60]}"
    for init in status.get("initContainerStatuses", []):
        state = init.get("state", {})
        if "running" in state:  # wait-for-models: the room's download is not complete yet
            return "waiting for models" if init.get("name") == "wait-for-models" else "downloading models"
        waiting = state.get("waiting")
        if waiting:
            return f"init: {waiting.get('reason', 'waiting')}"
        if state.get("terminated", {}).get("exitCode", 0) != 0:
            return "init: failed"
    containers = status.get("containerStatuses", [])
    for c in containers:
        waiting = c.get("state", {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "PodInitializing", "ContainerCreating"):
            return waiting["reason"]
    if containers and all(c.get("ready") for c in containers):
        return "ready"
    return "starting" if status.get("phase") in ("Pending", "Running") else status.get("phase", "unknown").lower()


def parse_status(listing: Mapping[str, Any]) -> list[ParticipantStatus]:
    """Per-namespace status rows from ``kubectl get pods -A -l <managed> -o json`` output."""
    pods: dict[str, dict[str, Mapping[str, Any]]] = {}
    for item in listing.get("items", []):
        if item.get("kind", "Pod") != "Pod":
            continue
        meta = item["metadata"]
        app = (meta.get("labels") or {}).get("app.kubernetes.io/name", "")
        current = pods.setdefault(meta["namespace"], {}).get(app)
        # During a Recreate rollout two pods can exist: show the newest.
        if current is None or meta.get("creationTimestamp", "") > current["metadata"].get("creationTimestamp", ""):
            pods[meta["namespace"]][app] = item
    rows = []
    for ns in sorted(pods):
        engine, notebook = pods[ns].get("vllm"), pods[ns].get("notebook")
        if engine is None and notebook is None:
            continue  # the room's download namespace: no participant there
        restarts = sum(c.get("restartCount", 0) for c in (engine or {}).get("status", {}).get("containerStatuses", []))
        rows.append(ParticipantStatus(
            namespace=ns,
            engine=_pod_state(engine) if engine else "no pod",
            notebook=_pod_state(notebook) if notebook else "no pod",
            engine_restarts=restarts,
            node=(engine or {}).get("spec", {}).get("nodeName") or "-",
        ))
    return rows


def status(prefix: str | None = None, runner: Runner | None = None) -> list[ParticipantStatus]:
    """Status rows of every provisioned participant (of ``prefix``, if given) from the live cluster."""
    out = kubectl(["get", "pods", "--all-namespaces", "-l", managed_selector(prefix), "-o", "json"], runner)
    return parse_status(json.loads(out))

