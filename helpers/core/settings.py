"""The environment contract, read in one place.

Variables: ``VLLM_HOST`` (the server root or its base URL ending in /v1), ``MODEL_NAME``, ``VLLM_API_KEY``, ``NAMESPACE``,
``WORKSHOP_PROFILE`` (``cpu``, ``gpu`` or ``k8s``) and ``WORKSHOP_PORT`` (local engine port); ``WORKSHOP_GPU``, the
workshop GPU's name as ``helpers/hardware/gpus.py`` spells it (provisioning sets it in the notebook pod; unset:
``DEFAULT_WORKSHOP_GPU``), and ``WORKSHOP_EXTRA_MODELS``, the models the room downloads beyond the base list
(the notebook pod gets the ConfigMap's ``PREDOWNLOAD_EXTRA_MODELS``: the MoE with ``k8s/components/with-moe``).

Profiles:
- ``cpu`` (the default when ``VLLM_HOST`` is unset): the helpers run vLLM's CPU build locally,
  serving the tiny models shipped in ``models/``.
- ``gpu``: the helpers run vLLM locally on one NVIDIA GPU, serving the Qwen3-4B family.
- ``k8s``: the participant's engine in their namespace, reached at ``VLLM_HOST``.
With ``VLLM_HOST`` set, the endpoint is used as it is and no local engine is started.

Secrets are never printed: ``repr`` and ``describe()`` show only whether a key is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit, urlunsplit

from helpers.core.errors import WorkshopError

PROFILES = ("cpu", "gpu", "k8s")
CONTRACT_VARIABLES = ("VLLM_HOST", "MODEL_NAME", "VLLM_API_KEY", "NAMESPACE", "WORKSHOP_PROFILE")
DEFAULT_PORT = 8000
TINY_AGENT = "tiny-agent"
TINY_QWEN3 = "tiny-qwen3"  # the thinking stand-in for Qwen3-4B (models/tiny-qwen3): served with --reasoning-parser qwen3
GPU_MODEL = "Qwen/Qwen3-4B"
# The GPU the notebooks compute on paper for when WORKSHOP_GPU is unset (off the cluster): the public workshop's.
DEFAULT_WORKSHOP_GPU = "RTX 4000 Ada"


class SettingsError(WorkshopError, ValueError):
    """The environment does not describe a usable endpoint."""


def models_dir() -> Path:
    """Where the shipped tiny models live: the clone's models/ or a wheel's copy (``WORKSHOP_MODELS_DIR`` overrides)."""
    from helpers.core.kit_paths import kit_dir

    override = os.environ.get("WORKSHOP_MODELS_DIR")
    return Path(override) if override else kit_dir("models")


def state_dir() -> Path:
    """Where the local engine keeps its state and logs (``WORKSHOP_STATE_DIR`` overrides)."""
    override = os.environ.get("WORKSHOP_STATE_DIR")
    base = Path(override) if override else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "workshop"
    base.mkdir(parents=True, exist_ok=True)
    return base


@dataclass(frozen=True)
class Settings:
    """Where the engine is, which model it serves, and how to authenticate."""

    profile: str
    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    namespace: str | None = None
    port: int = DEFAULT_PORT
    managed: bool = True  # True: the helpers start and stop this engine themselves
    gpu: str = DEFAULT_WORKSHOP_GPU  # WORKSHOP_GPU: the workshop GPU's name in helpers/hardware/gpus.py
    gpu_is_default: bool = True  # True: WORKSHOP_GPU was unset, so ``gpu`` is DEFAULT_WORKSHOP_GPU
    extra_models: tuple[str, ...] = ()  # WORKSHOP_EXTRA_MODELS: what the room downloads beyond the base list

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint: the base URL's root plus /metrics."""
        parts = urlsplit(self.base_url)
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[: -len("/v1")]
        return urlunsplit((parts.scheme, parts.netloc, path + "/metrics", "", ""))

    @property
    def root_url(self) -> str:
        """The server root (base URL without /v1), for /health and /metrics."""
        return self.metrics_url[: -len("/metrics")]

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header for the endpoint (empty without a key); never print it."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def describe(self) -> dict[str, object]:
        """The settings as a dict safe to print: the API key shows only as set or not."""
        return {
            "profile": self.profile,
            "endpoint": self.base_url,
            "metrics_url": self.metrics_url,
            "model": self.model,
            "namespace": self.namespace,
            "api_key": "set" if self.api_key else "not set",
            "engine": "local, started by the helpers" if self.managed else "external",
        }


# Endpoints of the OpenAI API under /v1: a VLLM_HOST copied from a request URL loses them.
OPENAI_ENDPOINTS = ("/chat/completions", "/completions", "/models", "/responses", "/embeddings")
# Paths of vLLM's server root, and the OpenAI endpoints without their /v1: a VLLM_HOST ending in one is a mistake.
SERVER_PATHS = ("/health", "/metrics", "/version", "/ping", "/docs", "/tokenize", "/detokenize", *OPENAI_ENDPOINTS)
BASE_URL_FORM = "the server root or its /v1 base URL, e.g. http://vllm-engine:8000 or http://vllm-engine:8000/v1"


def _normalize_base_url(url: str) -> str:
    """VLLM_HOST as the OpenAI base URL ending in /v1: a server root gains /v1 (a proxy's path prefix is kept),
    a known endpoint after /v1 is dropped; SettingsError showing the expected form for anything else."""
    url = url.strip()
    if not url.lower().startswith(("http://", "https://")):
        raise SettingsError(f"VLLM_HOST must start with http:// or https:// (got {url!r}): give {BASE_URL_FORM}")
    parts = urlsplit(url)
    try:
        parts.port  # raises ValueError on a port that is not a number
    except ValueError:
        raise SettingsError(f"VLLM_HOST has a port that is not a number (got {url!r}): give {BASE_URL_FORM}") from None
    if not parts.hostname:
        raise SettingsError(f"VLLM_HOST has no host name (got {url!r}): give {BASE_URL_FORM}")
    if parts.query or parts.fragment:
        raise SettingsError(f"VLLM_HOST must not carry a ?query or #fragment (got {url!r}): give {BASE_URL_FORM}")
    path = parts.path.rstrip("/")
    for endpoint in OPENAI_ENDPOINTS:
        if path.endswith("/v1" + endpoint):
            path = path[: -len(endpoint)]
            break
    segments = path.split("/")
    server_path = next((p for p in SERVER_PATHS if path.endswith(p)), None)
    if "v1" not in segments and server_path is None:  # the root, or a proxy's path prefix
        path += "/v1"
    elif segments[-1] != "v1" or segments.count("v1") > 1:
        meant = "/".join(segments[: segments.index("v1") + 1]) if "v1" in segments else path[: -len(server_path)] + "/v1"
        raise SettingsError(f"VLLM_HOST {url!r} is not {BASE_URL_FORM}; did you mean "
                            f"{urlunsplit((parts.scheme, parts.netloc, meant, '', ''))}?")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read the environment contract (``os.environ`` by default) into Settings."""
    env = os.environ if env is None else env
    host = env.get("VLLM_HOST", "").strip()
    profile = env.get("WORKSHOP_PROFILE", "").strip().lower() or ("k8s" if host and env.get("NAMESPACE") else "cpu")
    if profile not in PROFILES:
        raise SettingsError(f"WORKSHOP_PROFILE must be one of {', '.join(PROFILES)} (got {profile!r})")
    try:
        port = int(env.get("WORKSHOP_PORT", DEFAULT_PORT))
    except ValueError:
        raise SettingsError(f"WORKSHOP_PORT must be a port number (got {env.get('WORKSHOP_PORT')!r})") from None
    if profile == "k8s" and not host:
        raise SettingsError("The k8s profile needs VLLM_HOST (the engine's URL in your namespace, ending in /v1). "
                            "Your notebook pod sets it; elsewhere, export it first.")
    default_model = TINY_AGENT if profile == "cpu" else GPU_MODEL
    gpu = env.get("WORKSHOP_GPU", "").strip()
    return Settings(
        profile=profile,
        base_url=_normalize_base_url(host) if host else f"http://127.0.0.1:{port}/v1",
        model=env.get("MODEL_NAME", "").strip() or default_model,
        api_key=env.get("VLLM_API_KEY") or None,
        namespace=env.get("NAMESPACE") or None,
        port=port,
        managed=not host,
        gpu=gpu or DEFAULT_WORKSHOP_GPU,
        gpu_is_default=not gpu,
        extra_models=tuple(env.get("WORKSHOP_EXTRA_MODELS", "").split()),
    )
