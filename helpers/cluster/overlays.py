"""Per-participant Kubernetes namespaces, rendered: the workshop's settings and one kustomize overlay each.

``render`` writes one kustomize overlay per participant on top of ``k8s/base`` (namespace
``<prefix>-<NN>``, the labels below, the provisioning annotation on the Namespace, the model, the
GPU sizing and share, the read-only view of the room's models, the egress fences) and one for the room,
``<prefix>-models`` (k8s/models: the workshop's one download; ``helpers.cluster.room``). It keeps each
participant's secrets (notebook token, engine API key) in ``<overlay>/.secrets/``, mode 600, reused on the
next run: rendering twice gives byte-identical files. Each overlay holds a marker file; rendering fewer participants into the same directory
removes the files it wrote in the overlays no longer needed and nothing else. Nothing here runs
kubectl: ``helpers.cluster.namespaces`` applies the overlays, ``helpers.cluster.cards`` hands out the tokens.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from helpers.cluster import room
from helpers.cluster.kubectl import ProvisionError
from helpers.core import kit_paths
from helpers.hardware.gpus import get_gpu

K8S_DIR = kit_paths.kit_dir("k8s")  # the clone's k8s/, or a wheel's copy inside the package
DEFAULT_OUT_DIR = Path("build") / "workshop"
SETTINGS_FILE = "workshop.json"
SECRETS_DIR = ".secrets"
OVERLAY_MARKER = ".workshop-overlay"  # in every overlay render wrote: what a later render may clean up
MODEL_VOLUME_FILE = "model-volume.yaml"  # the overlay's PersistentVolume onto the room's NFS export
EGRESS_FILE = "egress.yaml"  # the overlay's NetworkPolicies: the Kubernetes API and the instructor's opt-ins
OVERLAY_FILES = ("kustomization.yaml", "kubeconfig", OVERLAY_MARKER, MODEL_VOLUME_FILE, EGRESS_FILE,
                 f"{SECRETS_DIR}/notebook-token", f"{SECRETS_DIR}/vllm-api-key")  # all that render writes there

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "workshop-provision"
PARTICIPANT_LABEL = "workshop/participant"
PREFIX_LABEL = "workshop/prefix"
PROVISIONED_ANNOTATION = "workshop/provisioned-by"  # on the Namespace only, value MANAGED_BY
SYSTEM_NAMESPACES = ("default", "kube-*", "openshift", "openshift-*")  # teardown never deletes these (fnmatch)
MAX_PARTICIPANTS = 99  # namespace suffixes are two digits


@dataclass(frozen=True)
class GpuProfile:
    """A GPU type provisioning knows: its row in helpers.hardware.gpus and the sizing component it adds."""

    name: str
    gpu: str  # name in helpers.hardware.gpus.GPUS
    component: str | None  # k8s/components/<component>; None: the base is sized for it


GPU_PROFILES: dict[str, GpuProfile] = {
    "l4": GpuProfile("l4", "L4", None),
    "a100": GpuProfile("a100", "A100 40GB SXM", "gpu-a100"),  # the 40 GB one: the conservative choice
    "h100": GpuProfile("h100", "H100 SXM", "gpu-h100"),
    "a100-80gb": GpuProfile("a100-80gb", "A100 80GB SXM", "gpu-a100"),  # the one with MIG slices of 10-80 GB
}


@dataclass(frozen=True)
class LabModel:
    """A model the labs serve, with its weight size in GB (decimal) and where that figure comes from."""

    name: str
    weights_gb: float
    source: str


MOE_MODEL = "Qwen/Qwen3-30B-A3B"
LAB_MODELS: dict[str, LabModel] = {m.name: m for m in (
    LabModel("Qwen/Qwen3-4B", 8.04, "Qwen3-4B config.json: 4,022,468,096 params (helpers.planning.shape.count_params) x 2 bytes (BF16)"),
    LabModel("RedHatAI/Qwen3-4B-FP8-dynamic", 4.41, "Qwen3-4B config.json: linear layers in FP8, embeddings in BF16 (helpers.planning.weights.weight_bytes)"),
    LabModel("Qwen/Qwen3-0.6B", 1.19, "Qwen3-0.6B config.json: 596,049,920 params (helpers.planning.shape.count_params) x 2 bytes (BF16)"),
    LabModel(MOE_MODEL, 61.06, "Qwen3-30B-A3B config.json: 30,532,122,624 params (helpers.planning.shape.count_params) x 2 bytes (BF16)"),
)}
GPU_MEMORY_UTILIZATION = 0.90  # the labs' baseline --gpu-memory-utilization
MIN_KV_AND_RUNTIME_GB = 4.0  # room left for KV cache, activations and CUDA graphs at 8192 tokens


# ---------------------------------------------------------------- settings of one workshop

@dataclass(frozen=True)
class Workshop:
    """What was provisioned: stored as workshop.json beside the overlays."""

    prefix: str
    participants: int
    model: str
    gpu_type: str
    with_moe: bool = False
    domain: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    api_key: bool = True
    notebook_image: str | None = None  # None: the base's image (BASE_NOTEBOOK_IMAGE)
    engine_image: str | None = None  # None: the base's pinned vLLM image (BASE_ENGINE_IMAGE)
    model_nfs: str = ""  # SERVER:/PATH, the NFS export of the room's one copy of the models
    kube_api: list[str] = field(default_factory=list)  # CIDR:PORT of the API server's endpoints; ["none"]: closed
    egress_allow: list[str] = field(default_factory=list)  # CIDR[:PORT] the instructor opens to every pod
    egress_internet: bool = False  # HTTPS/HTTP to public addresses (pip installs), never private or link-local
    ingress_class: str = "nginx"
    monitoring_namespace: str = "monitoring"
    ingress_namespace: str = "ingress-nginx"
    gpu_share: str = "none"  # none, mig-PROFILE, time-slicing:N

    def namespaces(self) -> list[str]:
        """The participants' namespace names, in order."""
        return [namespace_name(self.prefix, i) for i in range(1, self.participants + 1)]


def namespace_name(prefix: str, number: int) -> str:
    """``<prefix>-<NN>``: the namespace of participant ``number`` (1-based)."""
    return f"{prefix}-{number:02d}"


DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def validate(ws: Workshop) -> None:
    """Raise ProvisionError when the settings cannot make a working workshop."""
    if not 1 <= ws.participants <= MAX_PARTICIPANTS:
        raise ProvisionError(f"--participants must be between 1 and {MAX_PARTICIPANTS} (got {ws.participants})")
    if (not DNS_LABEL.match(ws.prefix) or len(ws.prefix) > 40 or ws.prefix.startswith("kube")
            or is_system_namespace(namespace_name(ws.prefix, 1))):
        raise ProvisionError(f"--prefix {ws.prefix!r} must be a lowercase DNS label (a-z, 0-9, '-'), at most "
                             "40 characters, not starting with 'kube' or 'openshift'; e.g. --prefix ws")
    if ws.gpu_type not in GPU_PROFILES:
        raise ProvisionError(f"unknown --gpu-type {ws.gpu_type!r}: choose one of {', '.join(GPU_PROFILES)}")
    if ws.model not in LAB_MODELS:
        raise ProvisionError(f"unknown --model {ws.model!r}: the labs use {', '.join(LAB_MODELS)} "
                             "(add a model to helpers.cluster.overlays.LAB_MODELS with its weight size first)")
    gpu_gb = get_gpu(GPU_PROFILES[ws.gpu_type].gpu).memory_bytes / 1e9
    need_gb = LAB_MODELS[ws.model].weights_gb + MIN_KV_AND_RUNTIME_GB
    if need_gb > gpu_gb * GPU_MEMORY_UTILIZATION:
        raise ProvisionError(f"{ws.model} needs about {need_gb:.0f} GB of GPU memory; a {ws.gpu_type} gives vLLM "
                             f"{gpu_gb * GPU_MEMORY_UTILIZATION:.0f} GB: choose --gpu-type h100 or a smaller model")
    for key, value in ws.node_selector.items():
        if not key or "=" in key or not value:
            raise ProvisionError(f"--node-selector needs KEY=VALUE (got {key}={value})")
    if ws.domain is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", ws.domain):
        raise ProvisionError(f"--domain {ws.domain!r} must be a DNS name such as workshop.example.com")
    if ws.notebook_image is not None:
        image_override(BASE_NOTEBOOK_IMAGE, ws.notebook_image, "--notebook-image")
    if ws.engine_image is not None:
        image_override(BASE_ENGINE_IMAGE, ws.engine_image, "--engine-image")
    if not ws.model_nfs:
        raise ProvisionError("--model-nfs SERVER:/PATH is needed: the NFS export that holds the room's one copy "
                             "of the models, downloaded once by the instructor's namespace and mounted read-only "
                             "by every participant (k8s/README.md, 'One download for the room')")
    room.parse_nfs(ws.model_nfs)
    if not ws.kube_api:
        raise ProvisionError("--kube-api ADDRESS/32:PORT is needed: the API server's endpoints, which the notebooks "
                             "call to change engine flags (a NetworkPolicy cannot name the API server). Find them "
                             "with `kubectl get endpointslices -n default -l kubernetes.io/service-name=kubernetes`; "
                             "--kube-api none leaves the API closed (the labs that change flags then fail)")
    room.egress_policies([] if ws.kube_api == ["none"] else ws.kube_api, ws.egress_allow, ws.egress_internet)
    for flag, name in (("--monitoring-namespace", ws.monitoring_namespace),
                       ("--ingress-namespace", ws.ingress_namespace), ("--ingress-class", ws.ingress_class)):
        if not DNS_LABEL.match(name) or len(name) > 63:
            raise ProvisionError(f"{flag} {name!r} must be a lowercase DNS label, e.g. {flag} monitoring")
    share = room.parse_gpu_share(ws.gpu_share, GPU_PROFILES[ws.gpu_type].gpu)
    if share.spec != "none":  # a whole GPU: the check above
        room.check_share(ws.model, share, GPU_PROFILES[ws.gpu_type].gpu)


BASE_NOTEBOOK_IMAGE = "quay.io/jupyter/minimal-notebook"  # image names in k8s/base (tags in its kustomization.yaml)
BASE_ENGINE_IMAGE = "vllm/vllm-openai"
# registry/path, then :tag and/or @sha256:digest; the tag or the digest must be given (pinned images only)
_IMAGE_REF = re.compile(r"^(?P<name>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+(?=/))?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
                        r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


def image_override(base_name: str, ref: str, flag: str) -> dict[str, str]:
    """A kustomize ``images:`` entry that makes ``base_name`` run ``ref`` (registry/name:tag or name@sha256:...)."""
    match = _IMAGE_REF.match(ref)
    if match is None or not (match["tag"] or match["digest"]) or (match["tag"] == "latest" and not match["digest"]):
        raise ProvisionError(f"{flag} {ref!r} is not a pinned image reference: give registry/name:tag or "
                             "registry/name@sha256:<digest>, e.g. ghcr.io/acme/workshop-notebook:2026-09-01 "
                             "(the image `make image IMAGE=...` built and pushed). A mutable tag such as "
                             ":latest is refused: pods pull only when the image is absent (IfNotPresent), so "
                             "nodes would run whichever :latest each one pulled first")
    entry = {"name": base_name, "newName": match["name"]}
    if match["tag"]:
        entry["newTag"] = match["tag"]
    if match["digest"]:
        entry["digest"] = match["digest"]
    return entry


def is_system_namespace(name: str) -> bool:
    """True for ``default``, ``kube-*``, ``openshift`` and ``openshift-*``: never provisioned, never deleted."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SYSTEM_NAMESPACES)


def load_workshop(out_dir: Path | str) -> Workshop:
    """Read the workshop.json that ``render`` wrote into ``out_dir``."""
    path = Path(out_dir) / SETTINGS_FILE
    if not path.is_file():
        raise ProvisionError(f"{path} not found: run `workshop provision` first (or pass the directory it wrote)")
    try:
        return Workshop(**json.loads(path.read_text()))
    except (ValueError, TypeError) as err:
        raise ProvisionError(f"{path} is not a workshop.json written by `workshop provision` ({err}): "
                             "render into a new --out directory") from None


# ---------------------------------------------------------------- rendering

def _ensure_secret(path: Path, nbytes: int = 24) -> None:
    """Keep the secret stored at ``path``, or create a random one (hex) there with mode 600."""
    if path.is_file():
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(nbytes))


def _write(path: Path, text: str) -> None:
    """Write ``text`` unless the file already holds exactly it (keeps mtimes of unchanged files)."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


class _Dumper(yaml.SafeDumper):
    """Block style; multi-line strings (inline patches) as literal blocks."""


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Quoted when a YAML 1.2 reader (kustomize's) could take it for a number: PyYAML (YAML 1.1) writes "08" and
    # "09" plain, as they are no octal numbers to it, and kustomize then reads the label value 8 and refuses it.
    style = "|" if "\n" in value else ("'" if re.fullmatch(r"[-+.0-9][-+._0-9a-fA-FxXoOeE:]*", value) else None)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_presenter)


def _dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def _base_engine_args() -> list[str]:
    """The vLLM container's args in k8s/base; fail unless they start with --model M --served-model-name M."""
    if not (K8S_DIR / "base" / "vllm.yaml").is_file():
        raise ProvisionError(kit_paths.missing_kit_message("k8s", K8S_DIR))
    docs = list(yaml.safe_load_all((K8S_DIR / "base" / "vllm.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    if args[0] != "--model" or args[2] != "--served-model-name" or "--gpu-memory-utilization" not in args:
        raise ProvisionError("k8s/base/vllm.yaml: the vllm container's args must start with "
                             "--model M --served-model-name M (provisioning replaces items 1 and 3) and hold "
                             "--gpu-memory-utilization (a time-sliced GPU share divides it)")
    return [str(a) for a in args]


def model_cache_size(ws: Workshop) -> str:
    """The size of the room's model volume: what k8s/components/with-moe asks for when the MoE model is in."""
    return "120Gi" if ws.with_moe or ws.model == MOE_MODEL else "50Gi"


def kubeconfig_text(namespace: str) -> str:
    """The notebook's kubeconfig (k8s/base/files/kubeconfig) with the context set to ``namespace``."""
    config = yaml.safe_load((K8S_DIR / "base" / "files" / "kubeconfig").read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = namespace
    return _dump(config)


def overlay(ws: Workshop, number: int, overlay_dir: Path) -> dict[str, Any]:
    """The kustomization (as a dict) of participant ``number``, with paths relative to ``overlay_dir``."""
    ns = namespace_name(ws.prefix, number)
    rel = Path(os.path.relpath(K8S_DIR, overlay_dir.resolve()))
    components = [str(rel / "components" / "shared-models")]
    if GPU_PROFILES[ws.gpu_type].component:
        components.append(str(rel / "components" / GPU_PROFILES[ws.gpu_type].component))
    if ws.with_moe or ws.model == MOE_MODEL:
        components.append(str(rel / "components" / "with-moe"))
    if ws.domain:
        components.append(str(rel / "components" / "ingress"))

    engine_patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args/1", "value": ws.model},
                    {"op": "replace", "path": "/spec/template/spec/containers/0/args/3", "value": ws.model}]
    if ws.node_selector:
        engine_patch.append({"op": "replace", "path": "/spec/template/spec/nodeSelector",
                             "value": ws.node_selector})
    share = room.parse_gpu_share(ws.gpu_share, GPU_PROFILES[ws.gpu_type].gpu)
    share_engine, share_quota = room.gpu_share_patches(share, _base_engine_args(), GPU_MEMORY_UTILIZATION)
    engine_patch += share_engine
    namespace_patch = {"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": ns, "annotations": {PROVISIONED_ANNOTATION: MANAGED_BY}}}
    patches = [{"target": {"kind": "Namespace"}, "patch": _dump(namespace_patch)},
               {"target": {"kind": "Deployment", "name": "vllm"}, "patch": _dump(engine_patch)},
               {"target": {"kind": "PersistentVolumeClaim", "name": room.MODEL_CLAIM}, "patch": _dump([
                   {"op": "replace", "path": "/spec/volumeName", "value": f"{ns}-{room.MODEL_CLAIM}"}])},
               {"target": {"kind": "NetworkPolicy", "name": "allow-prometheus-to-vllm"},
                "patch": _dump(room.namespace_peer_patch(0, ws.monitoring_namespace))},
               {"target": {"kind": "NetworkPolicy", "name": "allow-ingress-controller-to-notebook"},
                "patch": _dump(room.namespace_peer_patch(0, ws.ingress_namespace))}]
    if share_quota:
        patches.append({"target": {"kind": "ResourceQuota", "name": "participant-quota"}, "patch": _dump(share_quota)})
    if ws.domain:
        host = f"{ns}.{ws.domain}"
        patches.append({"target": {"kind": "Ingress", "name": "notebook"}, "patch": _dump([
            {"op": "replace", "path": "/spec/rules/0/host", "value": host},
            {"op": "replace", "path": "/spec/tls/0/hosts/0", "value": host},
            {"op": "replace", "path": "/spec/ingressClassName", "value": ws.ingress_class},
        ])})

    secret_generators = [{"name": "notebook-token", "type": "Opaque", "files": [f"token={SECRETS_DIR}/notebook-token"]}]
    if ws.api_key:
        secret_generators.append({"name": "vllm-api-key", "type": "Opaque",
                                  "files": [f"api-key={SECRETS_DIR}/vllm-api-key"]})
    data: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": ns,
        "resources": [str(rel / "base"), MODEL_VOLUME_FILE] + ([EGRESS_FILE] if _egress(ws) else []),
    }
    if components:
        data["components"] = components
    images = [image_override(BASE_NOTEBOOK_IMAGE, ws.notebook_image, "--notebook-image")] if ws.notebook_image else []
    if ws.engine_image:
        images.append(image_override(BASE_ENGINE_IMAGE, ws.engine_image, "--engine-image"))
    if images:
        data["images"] = images
    data.update({
        "labels": [{"pairs": {MANAGED_BY_LABEL: MANAGED_BY, PREFIX_LABEL: ws.prefix,
                              PARTICIPANT_LABEL: f"{number:02d}"},
                    "includeSelectors": False, "includeTemplates": True}],
        "generatorOptions": {"disableNameSuffixHash": True},
        "secretGenerator": secret_generators,
        "configMapGenerator": [
            {"name": "workshop-engine", "behavior": "merge",
             "literals": [f"MODEL_NAME={ws.model}", f"WORKSHOP_GPU={GPU_PROFILES[ws.gpu_type].gpu}"]},
            {"name": "participant-kubeconfig", "behavior": "replace", "files": ["config=kubeconfig"]},
        ],
        "patches": patches,
    })
    return data


def _egress(ws: Workshop) -> list[dict[str, Any]]:
    """The overlay's NetworkPolicies beyond the base's: the Kubernetes API and the instructor's opt-ins."""
    return room.egress_policies([] if ws.kube_api == ["none"] else ws.kube_api, ws.egress_allow, ws.egress_internet)


def room_overlay(ws: Workshop, room_dir: Path) -> dict[str, Any]:
    """The kustomization (as a dict) of the instructor's namespace ``<prefix>-models``: the one download."""
    ns = room.models_namespace(ws.prefix)
    rel = Path(os.path.relpath(K8S_DIR, room_dir.resolve()))
    data: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                            "namespace": ns, "resources": [str(rel / "models"), MODEL_VOLUME_FILE]}
    if ws.with_moe or ws.model == MOE_MODEL:
        data["components"] = [str(rel / "components" / "with-moe")]
    if ws.engine_image:
        data["images"] = [image_override(BASE_ENGINE_IMAGE, ws.engine_image, "--engine-image")]
    namespace_patch = {"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": ns, "annotations": {PROVISIONED_ANNOTATION: MANAGED_BY}}}
    data.update({
        "labels": [{"pairs": {MANAGED_BY_LABEL: MANAGED_BY, PREFIX_LABEL: ws.prefix},
                    "includeSelectors": False, "includeTemplates": True}],
        "patches": [{"target": {"kind": "Namespace"}, "patch": _dump(namespace_patch)},
                    {"target": {"kind": "PersistentVolumeClaim", "name": room.MODEL_CLAIM}, "patch": _dump([
                        {"op": "replace", "path": "/spec/volumeName", "value": f"{ns}-{room.MODEL_CLAIM}"}])}],
    })
    return data


def _write_room(ws: Workshop, out: Path) -> Path:
    """Write the instructor's overlay ``<prefix>-models``: the download Job and the one writable model volume."""
    ns = room.models_namespace(ws.prefix)
    d = out / ns
    d.mkdir(exist_ok=True)
    _write(d / OVERLAY_MARKER, "Written by `workshop provision`: the room's one model download.\n")
    _write(d / MODEL_VOLUME_FILE, _dump(room.model_volume(f"{ns}-{room.MODEL_CLAIM}", ws.model_nfs,
                                                          model_cache_size(ws), ns, writable=True)))
    _write(d / "kustomization.yaml", f"# The room of workshop '{ws.prefix}': written by `workshop provision`; "
                                     "edits are overwritten.\n" + _dump(room_overlay(ws, d)))
    return d


@dataclass(frozen=True)
class Rendered:
    """What ``render`` did: the overlays it wrote, and what it removed or kept of overlays no longer needed."""

    overlays: list[Path]
    removed: list[str] = field(default_factory=list)  # overlay directories cleaned up (their files were ours)
    kept: list[Path] = field(default_factory=list)  # files render did not write, left in those directories
    room: Path | None = None  # the instructor's overlay <prefix>-models: the one download


def _check_out_dir(out: Path, ws: Workshop) -> Workshop | None:
    """Refuse an ``out`` that holds something other than this workshop's overlays; return its previous settings."""
    if out.exists() and not out.is_dir():
        raise ProvisionError(f"--out {out} is a file: pass a directory (new, or one `workshop provision` wrote)")
    if not out.is_dir() or not any(out.iterdir()):
        return None
    if not (out / SETTINGS_FILE).is_file():
        raise ProvisionError(f"--out {out} is not empty and has no {SETTINGS_FILE}, so `workshop provision` did "
                             "not write it: pass a new or empty directory")
    previous = load_workshop(out)
    if previous.prefix != ws.prefix:
        raise ProvisionError(f"--out {out} holds workshop {previous.prefix!r} ({previous.namespaces()[0]} ... "
                             f"{previous.namespaces()[-1]}), with its participants' tokens: render workshop "
                             f"{ws.prefix!r} into another --out, or --prefix {previous.prefix} to change that one")
    return previous


def _owned_overlays(out: Path, previous: Workshop | None) -> list[Path]:
    """The overlay directories under ``out`` that render wrote: with the marker, or named in the old workshop.json."""
    named = set(previous.namespaces()) if previous else set()
    return sorted(d for d in out.iterdir()
                  if d.is_dir() and not d.is_symlink() and ((d / OVERLAY_MARKER).is_file() or d.name in named))


def _remove_overlay(overlay_dir: Path) -> list[Path]:
    """Delete the files render writes in ``overlay_dir`` and the directories left empty; return the files kept."""
    for name in OVERLAY_FILES:
        path = overlay_dir / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
    for d in (overlay_dir / SECRETS_DIR, overlay_dir):
        with contextlib.suppress(OSError):  # not empty: something render did not write is in it
            d.rmdir()
    return sorted(p for p in overlay_dir.rglob("*") if not p.is_dir()) if overlay_dir.exists() else []


def render(participants: int, prefix: str = "ws", model: str = "Qwen/Qwen3-4B", gpu_type: str = "l4",
           out_dir: Path | str = DEFAULT_OUT_DIR, *, with_moe: bool = False, domain: str | None = None,
           node_selector: Mapping[str, str] | None = None, api_key: bool = True,
           notebook_image: str | None = None, engine_image: str | None = None, model_nfs: str = "",
           kube_api: list[str] | None = None, egress_allow: list[str] | None = None, egress_internet: bool = False,
           ingress_class: str = "nginx", monitoring_namespace: str = "monitoring",
           ingress_namespace: str = "ingress-nginx", gpu_share: str = "none") -> Rendered:
    """Write one kustomize overlay per participant under ``out_dir``; clean up the overlays it no longer needs.

    Secrets are created once and reused, so a second run with the same arguments writes the same bytes.
    ``out_dir`` must be new, empty, or written by an earlier render of the same ``prefix``; of an overlay
    no longer needed (fewer participants) only the files render wrote there are deleted.
    """
    ws = Workshop(prefix=prefix, participants=participants, model=model, gpu_type=gpu_type, with_moe=with_moe,
                  domain=domain, node_selector=dict(sorted((node_selector or {}).items())), api_key=api_key,
                  notebook_image=notebook_image, engine_image=engine_image, model_nfs=model_nfs,
                  kube_api=list(kube_api or []), egress_allow=list(egress_allow or []),
                  egress_internet=egress_internet, ingress_class=ingress_class,
                  monitoring_namespace=monitoring_namespace, ingress_namespace=ingress_namespace, gpu_share=gpu_share)
    _base_engine_args()  # the kit's manifests are there, and the model patch's layout holds: fail before writing
    validate(ws)
    out = Path(out_dir)
    previous = _check_out_dir(out, ws)
    out.mkdir(parents=True, exist_ok=True)
    keep = {*ws.namespaces(), room.models_namespace(ws.prefix)}
    stale = [d for d in _owned_overlays(out, previous) if d.name not in keep]
    _write(out / ".gitignore", f"# participants' tokens and keys: never commit them\n*/{SECRETS_DIR}/\ncards.*\n")
    _write(out / SETTINGS_FILE, json.dumps(asdict(ws), indent=2, sort_keys=True) + "\n")
    dirs = []
    for number, ns in enumerate(ws.namespaces(), start=1):
        d = out / ns
        d.mkdir(exist_ok=True)
        _write(d / OVERLAY_MARKER, "Written by `workshop provision`, like kustomization.yaml, kubeconfig and "
                                   f"{SECRETS_DIR}/: a later render\nthat no longer needs this participant "
                                   "deletes those files, and no other.\n")
        _ensure_secret(d / SECRETS_DIR / "notebook-token")
        if api_key:
            _ensure_secret(d / SECRETS_DIR / "vllm-api-key")
        _write(d / "kubeconfig", kubeconfig_text(ns))
        _write(d / MODEL_VOLUME_FILE, _dump(room.model_volume(f"{ns}-{room.MODEL_CLAIM}", ws.model_nfs,
                                                              model_cache_size(ws), ns, writable=False)))
        egress = _egress(ws)
        if egress:
            _write(d / EGRESS_FILE, "---\n".join(_dump(policy) for policy in egress))
        elif (d / EGRESS_FILE).is_file():
            (d / EGRESS_FILE).unlink()
        header = (f"# Participant {number:02d} of workshop '{prefix}': written by `workshop provision`; "
                  "edits are overwritten.\n")
        _write(d / "kustomization.yaml", header + _dump(overlay(ws, number, d)))
        dirs.append(d)
    room_dir = _write_room(ws, out)
    kept = [path for d in stale for path in _remove_overlay(d)]
    return Rendered(dirs, [d.name for d in stale], kept, room_dir)


def secret_values(out_dir: Path | str) -> set[str]:
    """Every secret value stored under ``out_dir`` (for checks that none leaks)."""
    return {p.read_text().strip() for p in Path(out_dir).glob(f"*/{SECRETS_DIR}/*") if p.is_file()}
