"""Per-participant Kubernetes namespaces: render overlays, apply them, show status, hand out cards.

``render`` writes one kustomize overlay per participant on top of ``k8s/base`` (namespace
``<prefix>-<NN>``, the labels below, the provisioning annotation on the Namespace, the model, the
GPU sizing) and keeps each participant's secrets (notebook token, engine API key) in
``<overlay>/.secrets/``, mode 600, reused on the next run: rendering twice gives byte-identical
files. Each overlay holds a marker file; rendering fewer participants into the same directory
removes the files it wrote in the overlays no longer needed and nothing else.
``teardown`` deletes a namespace only when it carries the label and the annotation, is named
``<prefix>-NN`` for the ``--prefix`` given, and is no system namespace (``SYSTEM_NAMESPACES``).
The kubectl-facing functions build a command and run it through one ``runner`` (``run_kubectl``
when None; tests pass a recorded fake). Secret values go only to the cards file, never to stdout.
"""

from __future__ import annotations

import contextlib
import csv
import fnmatch
import html
import io
import json
import os
import re
import secrets
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

from helpers.core import kit_paths
from helpers.hardware.gpus import get_gpu

K8S_DIR = kit_paths.kit_dir("k8s")  # the clone's k8s/, or a wheel's copy inside the package
DEFAULT_OUT_DIR = Path("build") / "workshop"
SETTINGS_FILE = "workshop.json"
SECRETS_DIR = ".secrets"
OVERLAY_MARKER = ".workshop-overlay"  # in every overlay render wrote: what a later render may clean up
OVERLAY_FILES = ("kustomization.yaml", "kubeconfig", OVERLAY_MARKER,
                 f"{SECRETS_DIR}/notebook-token", f"{SECRETS_DIR}/vllm-api-key")  # all that render writes there

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "workshop-provision"
PARTICIPANT_LABEL = "workshop/participant"
PREFIX_LABEL = "workshop/prefix"
PROVISIONED_ANNOTATION = "workshop/provisioned-by"  # on the Namespace only, value MANAGED_BY
FIELD_MANAGER = "workshop-provision"
SYSTEM_NAMESPACES = ("default", "kube-*", "openshift", "openshift-*")  # teardown never deletes these (fnmatch)
KUBECTL_TIMEOUT_S = 300.0
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
}


@dataclass(frozen=True)
class LabModel:
    """A model the labs serve, with its weight size in GB (decimal) and where that figure comes from."""

    name: str
    weights_gb: float
    source: str


MOE_MODEL = "Qwen/Qwen3-30B-A3B"
LAB_MODELS: dict[str, LabModel] = {m.name: m for m in (
    LabModel("Qwen/Qwen3-4B", 8.04, "Qwen3-4B config.json: 4,022,468,096 params (helpers.planning.memory.count_params) x 2 bytes (BF16)"),
    LabModel("RedHatAI/Qwen3-4B-FP8-dynamic", 4.41, "Qwen3-4B config.json: linear layers in FP8, embeddings in BF16 (helpers.planning.memory.weight_bytes)"),
    LabModel("Qwen/Qwen3-0.6B", 1.19, "Qwen3-0.6B config.json: 596,049,920 params (helpers.planning.memory.count_params) x 2 bytes (BF16)"),
    LabModel(MOE_MODEL, 61.06, "Qwen3-30B-A3B config.json: 30,532,122,624 params (helpers.planning.memory.count_params) x 2 bytes (BF16)"),
)}
GPU_MEMORY_UTILIZATION = 0.90  # the labs' baseline --gpu-memory-utilization
MIN_KV_AND_RUNTIME_GB = 4.0  # room left for KV cache, activations and CUDA graphs at 8192 tokens


class ProvisionError(RuntimeError):
    """Provisioning cannot go on; the message says what to do next."""


class KubectlNotFound(ProvisionError):
    """kubectl is not on PATH."""


class ClusterUnreachable(ProvisionError):
    """kubectl runs but finds no cluster (no kubeconfig, wrong context, network)."""


# ---------------------------------------------------------------- running kubectl

@dataclass(frozen=True)
class CommandResult:
    """What one kubectl invocation returned."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str]], CommandResult]


def run_kubectl(args: Sequence[str]) -> CommandResult:
    """Run ``kubectl ARGS`` and capture its output (the default runner)."""
    exe = shutil.which("kubectl")
    if exe is None:
        raise KubectlNotFound("kubectl is not installed or not on PATH: install it (the Kubernetes docs list "
                              "packages for every OS), then check `kubectl cluster-info` reaches your cluster.")
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise ClusterUnreachable(f"kubectl {' '.join(args[:2])} did not answer within {KUBECTL_TIMEOUT_S:.0f} s: "
                                 "check `kubectl cluster-info`.") from None
    return CommandResult(tuple(args), proc.returncode, proc.stdout, proc.stderr)


_UNREACHABLE = re.compile(r"(unable to connect to the server|connection to the server .* was refused|"
                          r"couldn't get current server api group list|no configuration has been provided|"
                          r"dial tcp|no such host|i/o timeout|context deadline exceeded|"
                          r"current-context is not set|context was not found)", re.IGNORECASE)


def kubectl(args: Sequence[str], runner: Runner | None = None) -> str:
    """Run kubectl through ``runner`` (default run_kubectl); return stdout, or raise a ProvisionError."""
    result = (runner or run_kubectl)(list(args))
    if result.returncode == 0:
        return result.stdout
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit code {result.returncode}"
    if _UNREACHABLE.search(result.stderr):
        raise ClusterUnreachable(f"No Kubernetes cluster reachable ({last.strip()}). Check `kubectl config "
                                 "current-context` and `kubectl cluster-info`, or set KUBECONFIG.")
    raise ProvisionError(f"kubectl {' '.join(args[:2])} failed: {last.strip()}")


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

    def namespaces(self) -> list[str]:
        """The participants' namespace names, in order."""
        return [namespace_name(self.prefix, i) for i in range(1, self.participants + 1)]


def namespace_name(prefix: str, number: int) -> str:
    """``<prefix>-<NN>``: the namespace of participant ``number`` (1-based)."""
    return f"{prefix}-{number:02d}"


_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def validate(ws: Workshop) -> None:
    """Raise ProvisionError when the settings cannot make a working workshop."""
    if not 1 <= ws.participants <= MAX_PARTICIPANTS:
        raise ProvisionError(f"--participants must be between 1 and {MAX_PARTICIPANTS} (got {ws.participants})")
    if (not _DNS_LABEL.match(ws.prefix) or len(ws.prefix) > 40 or ws.prefix.startswith("kube")
            or is_system_namespace(namespace_name(ws.prefix, 1))):
        raise ProvisionError(f"--prefix {ws.prefix!r} must be a lowercase DNS label (a-z, 0-9, '-'), at most "
                             "40 characters, not starting with 'kube' or 'openshift'; e.g. --prefix ws")
    if ws.gpu_type not in GPU_PROFILES:
        raise ProvisionError(f"unknown --gpu-type {ws.gpu_type!r}: choose one of {', '.join(GPU_PROFILES)}")
    if ws.model not in LAB_MODELS:
        raise ProvisionError(f"unknown --model {ws.model!r}: the labs use {', '.join(LAB_MODELS)} "
                             "(add a model to helpers.cluster.provision.LAB_MODELS with its weight size first)")
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


BASE_NOTEBOOK_IMAGE = "quay.io/jupyter/minimal-notebook"  # image names in k8s/base (tags in its kustomization.yaml)
BASE_ENGINE_IMAGE = "vllm/vllm-openai"
# registry/path, then :tag and/or @sha256:digest; the tag or the digest must be given (pinned images only)
_IMAGE_REF = re.compile(r"^(?P<name>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+(?=/))?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
                        r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


def image_override(base_name: str, ref: str, flag: str) -> dict[str, str]:
    """A kustomize ``images:`` entry that makes ``base_name`` run ``ref`` (registry/name:tag or name@sha256:...)."""
    match = _IMAGE_REF.match(ref)
    if match is None or not (match["tag"] or match["digest"]):
        raise ProvisionError(f"{flag} {ref!r} is not a pinned image reference: give registry/name:tag or "
                             "registry/name@sha256:<digest>, e.g. ghcr.io/acme/workshop-notebook:2026-09-01 "
                             "(the image `make image IMAGE=...` built and pushed)")
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
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_presenter)


def _dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def _check_base_engine_args() -> None:
    """Fail unless the vLLM container's args in k8s/base start with --model M --served-model-name M."""
    if not (K8S_DIR / "base" / "vllm.yaml").is_file():
        raise ProvisionError(kit_paths.missing_kit_message("k8s", K8S_DIR))
    docs = list(yaml.safe_load_all((K8S_DIR / "base" / "vllm.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    if args[0] != "--model" or args[2] != "--served-model-name":
        raise ProvisionError("k8s/base/vllm.yaml: the vllm container's args must start with "
                             "--model M --served-model-name M (provisioning replaces items 1 and 3)")


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
    components = []
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
    namespace_patch = {"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": ns, "annotations": {PROVISIONED_ANNOTATION: MANAGED_BY}}}
    patches = [{"target": {"kind": "Namespace"}, "patch": _dump(namespace_patch)},
               {"target": {"kind": "Deployment", "name": "vllm"}, "patch": _dump(engine_patch)}]
    if ws.domain:
        host = f"{ns}.{ws.domain}"
        patches.append({"target": {"kind": "Ingress", "name": "notebook"}, "patch": _dump([
            {"op": "replace", "path": "/spec/rules/0/host", "value": host},
            {"op": "replace", "path": "/spec/tls/0/hosts/0", "value": host},
        ])})

    secret_generators = [{"name": "notebook-token", "type": "Opaque", "files": [f"token={SECRETS_DIR}/notebook-token"]}]
    if ws.api_key:
        secret_generators.append({"name": "vllm-api-key", "type": "Opaque",
                                  "files": [f"api-key={SECRETS_DIR}/vllm-api-key"]})
    data: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": ns,
        "resources": [str(rel / "base")],
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
            {"name": "workshop-engine", "behavior": "merge", "literals": [f"MODEL_NAME={ws.model}"]},
            {"name": "participant-kubeconfig", "behavior": "replace", "files": ["config=kubeconfig"]},
        ],
        "patches": patches,
    })
    return data


@dataclass(frozen=True)
class Rendered:
    """What ``render`` did: the overlays it wrote, and what it removed or kept of overlays no longer needed."""

    overlays: list[Path]
    removed: list[str] = field(default_factory=list)  # overlay directories cleaned up (their files were ours)
    kept: list[Path] = field(default_factory=list)  # files render did not write, left in those directories


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
           notebook_image: str | None = None, engine_image: str | None = None) -> Rendered:
    """Write one kustomize overlay per participant under ``out_dir``; clean up the overlays it no longer needs.

    Secrets are created once and reused, so a second run with the same arguments writes the same bytes.
    ``out_dir`` must be new, empty, or written by an earlier render of the same ``prefix``; of an overlay
    no longer needed (fewer participants) only the files render wrote there are deleted.
    """
    ws = Workshop(prefix=prefix, participants=participants, model=model, gpu_type=gpu_type, with_moe=with_moe,
                  domain=domain, node_selector=dict(sorted((node_selector or {}).items())), api_key=api_key,
                  notebook_image=notebook_image, engine_image=engine_image)
    validate(ws)
    _check_base_engine_args()  # the model patch replaces args 1 and 3: fail before writing if the layout changed
    out = Path(out_dir)
    previous = _check_out_dir(out, ws)
    out.mkdir(parents=True, exist_ok=True)
    stale = [d for d in _owned_overlays(out, previous) if d.name not in ws.namespaces()]
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
        header = (f"# Participant {number:02d} of workshop '{prefix}': written by `workshop provision`; "
                  "edits are overwritten.\n")
        _write(d / "kustomization.yaml", header + _dump(overlay(ws, number, d)))
        dirs.append(d)
    kept = [path for d in stale for path in _remove_overlay(d)]
    return Rendered(dirs, [d.name for d in stale], kept)


def secret_values(out_dir: Path | str) -> set[str]:
    """Every secret value stored under ``out_dir`` (for checks that none leaks)."""
    return {p.read_text().strip() for p in Path(out_dir).glob(f"*/{SECRETS_DIR}/*") if p.is_file()}


# ---------------------------------------------------------------- cluster operations

def apply_command(overlay_dir: Path | str) -> list[str]:
    """kubectl arguments that apply one overlay (server-side, taking back fields notebooks patched)."""
    return ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "--force-conflicts", "-k", str(overlay_dir)]


def apply(out_dir: Path | str = DEFAULT_OUT_DIR, runner: Runner | None = None,
          namespaces: Iterable[str] | None = None) -> list[str]:
    """Apply the overlays under ``out_dir`` (all, or the given namespaces); return kubectl's summaries."""
    ws = load_workshop(out_dir)
    wanted = list(namespaces) if namespaces is not None else ws.namespaces()
    unknown = [ns for ns in wanted if ns not in ws.namespaces()]
    if unknown:
        raise ProvisionError(f"{', '.join(unknown)} not provisioned in {out_dir}: "
                             f"known are {', '.join(ws.namespaces())}")
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
    if not own or not re.fullmatch(re.escape(own) + r"-\d{2}", name):
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
    if prefix is not None and not _DNS_LABEL.match(prefix):
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
        if "running" in state:
            return "downloading models"
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


# ---------------------------------------------------------------- access cards

@dataclass(frozen=True)
class Card:
    """What one participant needs to start: their namespace, URL and notebook token."""

    participant: str
    namespace: str
    url: str
    token: str = field(repr=False)
    note: str = ""


def access_cards(out_dir: Path | str = DEFAULT_OUT_DIR) -> list[Card]:
    """One card per provisioned participant, from workshop.json and the stored tokens."""
    ws = load_workshop(out_dir)
    cards = []
    for number, ns in enumerate(ws.namespaces(), start=1):
        token_file = Path(out_dir) / ns / SECRETS_DIR / "notebook-token"
        if not token_file.is_file():
            raise ProvisionError(f"{token_file} is missing: run `workshop provision` again with the same settings")
        if ws.domain:
            url, note = f"https://{ns}.{ws.domain}/lab", ""
        else:
            url = "http://localhost:8888/lab"
            note = f"no --domain: kubectl -n {ns} port-forward svc/notebook 8888:8888"
        cards.append(Card(f"{number:02d}", ns, url, token_file.read_text().strip(), note))
    return cards


def cards_csv(cards: Sequence[Card]) -> str:
    """The cards as CSV: participant, namespace, url, token, note."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["participant", "namespace", "url", "token", "note"])
    for c in cards:
        writer.writerow([c.participant, c.namespace, c.url, c.token, c.note])
    return buf.getvalue()


def cards_html(cards: Sequence[Card], title: str = "Own your inference: your lab") -> str:
    """The cards as a printable HTML page, one card per participant."""
    e = html.escape
    items = "\n".join(
        f'<div class="card"><h2>Participant {e(c.participant)}</h2>'
        f"<p>Namespace: <code>{e(c.namespace)}</code></p>"
        f'<p>JupyterLab: <a href="{e(c.url)}">{e(c.url)}</a></p>'
        f"<p>Token: <code>{e(c.token)}</code></p>"
        + (f'<p class="note">{e(c.note)}</p>' if c.note else "") + "</div>"
        for c in cards)
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" + e(title) + "</title><style>"
            "body{font-family:sans-serif} .card{border:1px solid #444;border-radius:8px;padding:12px;margin:12px;"
            "width:28em;display:inline-block;vertical-align:top;page-break-inside:avoid} code{font-size:1.05em}"
            ".note{color:#555;font-size:.9em}</style></head><body>\n" + items + "\n</body></html>\n")


def write_cards(out_dir: Path | str = DEFAULT_OUT_DIR, fmt: str = "csv", out_file: Path | str | None = None) -> Path:
    """Write the access cards (csv or html) with mode 600; return the file's path."""
    if fmt not in ("csv", "html"):
        raise ProvisionError(f"--format must be csv or html (got {fmt!r})")
    cards = access_cards(out_dir)
    text = cards_csv(cards) if fmt == "csv" else cards_html(cards)
    path = Path(out_file) if out_file else Path(out_dir) / f"cards.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # also when the file existed with wider permissions
    return path
