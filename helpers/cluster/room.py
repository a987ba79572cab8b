"""The room's one copy of the models, and the fences around each participant's namespace, as manifests.

One download per workshop: the Job ``model-download`` in the instructor's namespace ``<prefix>-models``
(k8s/models) writes the models into an NFS export (``--model-nfs SERVER:/PATH``) through the only writable
PersistentVolume onto it; every participant's namespace mounts the same export read-only through its own
PersistentVolume and claim (a claim belongs to one namespace; k8s/components/shared-models). No storage class,
no hostPath (refused by the namespaces' ``baseline`` Pod Security level), nothing provisioned per participant.

The fences: egress from participant pods is denied (k8s/base/networkpolicy.yaml) but for DNS, their engine, the
Kubernetes API at the addresses given to ``--kube-api`` and what the instructor opts into (``--egress-allow``,
``--egress-internet``); no rule ever admits the cloud's metadata address. GPU shares (``--gpu-share``) become the
engine's resource name, its memory fraction and the quota. ``helpers.cluster.overlays`` calls these.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from helpers.cluster.kubectl import ProvisionError
from helpers.core.errors import WorkshopError
from helpers.hardware.gpu_shares import get_mig_profile
from helpers.planning import gpu_share as planner

METADATA_ADDRESS = ipaddress.ip_address("169.254.169.254")  # the cloud's instance metadata server
LINK_LOCAL = "169.254.0.0/16"
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", LINK_LOCAL)
MODELS_SUFFIX = "models"  # the instructor's namespace: <prefix>-models
DOWNLOAD_JOB = "model-download"  # k8s/models/download.yaml
MODEL_CLAIM = "model-cache"
KUBE_API_PODS = ("notebook", "vllm-router")  # app.kubernetes.io/name of the pods that call the API


def models_namespace(prefix: str) -> str:
    """The instructor's namespace of workshop ``prefix``, which holds the one download: ``<prefix>-models``."""
    return f"{prefix}-{MODELS_SUFFIX}"


# ---------------------------------------------------------------- the shared model volume

def parse_nfs(value: str) -> tuple[str, str]:
    """``SERVER:/PATH`` -> (server, path): the NFS export that holds the room's models."""
    server, sep, path = value.partition(":")
    if not sep or not server or not path.startswith("/") or not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+", server):
        raise ProvisionError(f"--model-nfs {value!r} is not SERVER:/PATH, e.g. --model-nfs 10.0.0.5:/workshop-models "
                             "(an NFS export every GPU node can mount, writable by UID 10001; k8s/README.md, "
                             "'One download for the room')")
    return server, path


def model_volume(name: str, nfs: str, size: str, claim_namespace: str, writable: bool) -> dict[str, Any]:
    """A PersistentVolume onto the NFS export, bound ahead to the claim ``model-cache`` of ``claim_namespace``."""
    server, path = parse_nfs(nfs)
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": size},
                     "accessModes": ["ReadWriteMany" if writable else "ReadOnlyMany"],
                     "persistentVolumeReclaimPolicy": "Retain",  # teardown deletes the PV, never the models
                     "storageClassName": "",
                     "claimRef": {"namespace": claim_namespace, "name": MODEL_CLAIM},
                     "nfs": {"server": server, "path": path, "readOnly": not writable}}}


# ---------------------------------------------------------------- egress

@dataclass(frozen=True)
class Destination:
    """An address range (and port, if given) that a provision flag opens for egress."""

    cidr: str
    port: int | None


def parse_destination(value: str, flag: str) -> Destination:
    """``CIDR[:PORT]`` (an address alone is a /32) -> Destination; refuse any range holding the metadata address."""
    text, port = value, None
    match = re.fullmatch(r"(.+):(\d{1,5})", value)
    if match and "." in match[1]:  # IPv4 with a port (an IPv6 address has colons of its own: no port)
        text, port = match[1], int(match[2])
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ProvisionError(f"{flag} {value!r} is not ADDRESS[/PREFIX][:PORT], e.g. {flag} 10.0.0.2/32:6443") from None
    if port is not None and not 0 < port < 65536:
        raise ProvisionError(f"{flag} {value!r}: the port must be between 1 and 65535")
    if network.version == 4 and METADATA_ADDRESS in network:
        raise ProvisionError(f"{flag} {value!r} contains the cloud's metadata address {METADATA_ADDRESS}, which "
                             "participants must never reach: give a narrower range")
    return Destination(str(network), port)


def _rule(destinations: list[Destination]) -> list[dict[str, Any]]:
    rules = []
    for d in destinations:
        rule: dict[str, Any] = {"to": [{"ipBlock": {"cidr": d.cidr}}]}
        if d.port is not None:
            rule["ports"] = [{"protocol": "TCP", "port": d.port}]
        rules.append(rule)
    return rules


def egress_policies(kube_api: list[str], allow: list[str], internet: bool) -> list[dict[str, Any]]:
    """NetworkPolicies that open the Kubernetes API (notebook, router) and the instructor's opt-ins (every pod)."""
    policies = []
    api = [parse_destination(v, "--kube-api") for v in kube_api]
    if api:
        policies.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                         "metadata": {"name": "allow-kube-api"},
                         "spec": {"podSelector": {"matchExpressions": [
                             {"key": "app.kubernetes.io/name", "operator": "In", "values": list(KUBE_API_PODS)}]},
                             "policyTypes": ["Egress"], "egress": _rule(api)}})
    opted = _rule([parse_destination(v, "--egress-allow") for v in allow])
    if internet:  # public addresses only: never the cluster's private ranges nor link-local (metadata)
        opted.append({"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_RANGES)}}],
                      "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 80}]})
    if opted:
        policies.append({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                         "metadata": {"name": "allow-instructor-opt-in-egress"},
                         "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": opted}})
    return policies


def namespace_peer_patch(rule: int, namespace: str) -> list[dict[str, Any]]:
    """A JSON patch that points an ingress rule's namespaceSelector at ``namespace``."""
    return [{"op": "replace", "path": f"/spec/ingress/{rule}/from/0/namespaceSelector/matchLabels",
             "value": {"kubernetes.io/metadata.name": namespace}}]


# ---------------------------------------------------------------- GPU shares

@dataclass(frozen=True)
class GpuShare:
    """How one participant's engine gets its GPU: a whole one, a MIG slice, or 1/N of a time-sliced one."""

    spec: str  # as given: none, mig-1g.10gb, time-slicing:4
    resource: str  # the extended resource the engine requests
    memory_fraction: float  # of the device the engine sees, for --gpu-memory-utilization
    sharers: int = 1  # engines on one device (time-slicing: N)


def parse_gpu_share(spec: str, gpu: str) -> GpuShare:
    """``none``, ``mig-PROFILE`` (a profile of ``gpu`` in helpers.hardware.gpu_shares) or ``time-slicing:N``."""
    try:
        parsed = planner.parse_gpu_share(spec)
        if parsed.kind == "mig":
            return GpuShare(str(parsed), get_mig_profile(gpu, parsed.profile or "").resource_name, 1.0)
    except WorkshopError as err:
        raise ProvisionError(str(err) if str(err).startswith("--gpu-share") else f"--gpu-share {spec}: {err}") from None
    if parsed.kind == "time-slicing":
        return GpuShare(str(parsed), "nvidia.com/gpu", 1.0 / parsed.replicas, parsed.replicas)
    return GpuShare("none", "nvidia.com/gpu", 1.0)


def gpu_memory_utilization(share: GpuShare, baseline: float) -> str:
    """The engine's --gpu-memory-utilization on ``share`` (the planner's: divided among time-slicing's sharers)."""
    return f"{planner.engine_gpu_memory_utilization(share.spec, baseline):.2f}"


def check_share(model: str, share: GpuShare, gpu: str) -> planner.ShareVerdict:
    """The planner's verdict for ``model`` on one ``share`` of ``gpu``; refuse a share the engine cannot start on."""
    try:
        verdict = planner.share_verdict(model, share.spec, gpu)
    except WorkshopError as err:
        raise ProvisionError(f"--gpu-share {share.spec}: the planner cannot size {model}: {err}") from None
    if verdict.verdict == planner.NO:
        raise ProvisionError(f"--gpu-share {share.spec}: {verdict.sentence.rstrip('.')}. Choose a larger share, FP8 weights "
                             "(--model RedHatAI/Qwen3-4B-FP8-dynamic) or --gpu-share none")
    return verdict


def gpu_share_patches(share: GpuShare, args: list[str], baseline: float) -> tuple[list[dict[str, Any]],
                                                                                 list[dict[str, Any]]]:
    """JSON patches for the engine Deployment and the participant's ResourceQuota on ``share``."""
    engine: list[dict[str, Any]] = []
    quota: list[dict[str, Any]] = []
    if share.resource != "nvidia.com/gpu":
        key = share.resource.replace("/", "~1")
        for part in ("requests", "limits"):
            base = f"/spec/template/spec/containers/0/resources/{part}"
            engine += [{"op": "remove", "path": f"{base}/nvidia.com~1gpu"},
                       {"op": "add", "path": f"{base}/{key}", "value": "1"}]
        quota += [{"op": "replace", "path": "/spec/hard/requests.nvidia.com~1gpu", "value": "0"},
                  {"op": "add", "path": f"/spec/hard/requests.{key}", "value": "1"}]
    if share.sharers > 1:
        index = args.index("--gpu-memory-utilization") + 1
        engine.append({"op": "replace", "path": f"/spec/template/spec/containers/0/args/{index}",
                       "value": gpu_memory_utilization(share, baseline)})
    return engine, quota


# ---------------------------------------------------------------- what a rendered workshop costs in downloads and disk

@dataclass(frozen=True)
class Footprint:
    """Downloads from the hub and model storage of a rendered workshop, read from its objects."""

    download_pods: int  # pod templates with a container that downloads (predownload.py without --wait)
    download_gb: float  # GB (decimal) those pods fetch: the models each lists, by their weight sizes
    backing_volumes: int  # distinct storage behind the model caches: dynamic claims, and NFS exports once each
    volume_gib: float  # the size those backing volumes ask for

    @property
    def sentence(self) -> str:
        """One line: downloads and storage."""
        return (f"{self.download_pods} pod(s) download {self.download_gb:,.1f} GB from the hub; the models sit on "
                f"{self.backing_volumes} volume(s) of {self.volume_gib:,.0f} GiB in all")


def _gib(quantity: str) -> float:
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1.0, "Ti": 2**10}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)", quantity)
    if not match:
        raise ValueError(f"not a binary quantity: {quantity!r}")
    return float(match[1]) * units[match[2]]


def _downloads(container: dict[str, Any]) -> bool:
    command = [str(c) for c in container.get("command", []) + container.get("args", [])]
    return any(c.endswith("predownload.py") for c in command) and "--wait" not in command


def footprint(objects: list[dict[str, Any]], weights_gb: dict[str, float]) -> Footprint:
    """Count, over every rendered object of a workshop (all namespaces), the pods that download from the hub,
    the GB they fetch (``weights_gb``: model -> GB) and the storage behind the claims named model-cache."""
    lists = {o["metadata"].get("namespace"): o["data"] for o in objects
             if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "workshop-engine"}
    pods, gb = 0, 0.0
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            continue
        spec = obj["spec"]["template"]["spec"]
        if any(_downloads(c) for c in spec.get("initContainers", []) + spec["containers"]):
            pods += 1
            data = lists.get(obj["metadata"].get("namespace"), {})
            models = re.split(r"[\s,]+", f"{data.get('PREDOWNLOAD_MODELS', '')} {data.get('PREDOWNLOAD_EXTRA_MODELS', '')}")
            gb += sum(weights_gb[m] for m in dict.fromkeys(models) if m)
    backing: dict[tuple[str, ...], float] = {}
    for obj in objects:
        meta, spec = obj["metadata"], obj.get("spec", {})
        if obj["kind"] == "PersistentVolumeClaim" and meta["name"] == MODEL_CLAIM and not spec.get("volumeName"):
            backing[("claim", meta.get("namespace", ""))] = _gib(spec["resources"]["requests"]["storage"])
        elif obj["kind"] == "PersistentVolume" and "nfs" in spec:
            key = ("nfs", spec["nfs"]["server"], spec["nfs"]["path"])
            backing[key] = max(backing.get(key, 0.0), _gib(spec["capacity"]["storage"]))
    return Footprint(pods, gb, len(backing), sum(backing.values()))
