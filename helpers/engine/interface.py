"""One engine interface, with interchangeable backends.

``Engine`` is what notebooks use: read the current arguments, set one flag, switch model, restart,
wait until ready, tail the log, stop. ``helpers.engine.local.LocalEngine`` runs a real vLLM server as a
process on this machine (vLLM's CPU build without a GPU, ``vllm`` with one);
``helpers.engine.k8s.KubernetesEngine`` patches the participant's Deployment behind the same methods;
``ExternalEngine`` only reads an endpoint someone else runs. ``helpers.engine.session.make_engine`` picks
one, so notebooks never branch on where the engine runs, and this module imports neither backend.

Ready means ``/v1/models`` lists the expected model and the engine has generated one token for it,
not merely that ``/health`` answers: a configuration can start and still fail on its first request
(a kernel this CPU lacks). Both backends wait with ``Engine.wait_serving``. A restart with new flags
that fails, at start or at that first token, shows the relevant log lines and brings the engine back
on the last good configuration.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from helpers.core.models import ROOM_MODELS
from helpers.core.settings import TINY_QWEN3, Settings, models_dir
from helpers.core.vllm_args import CPU_ENGINE_ENV, CPU_KV_CACHE_BYTES, EngineConfig, with_flag
from helpers.core.errors import WorkshopError

CPU_START_TIMEOUT_S = 300.0
GPU_START_TIMEOUT_S = 1200.0


class EngineError(WorkshopError, RuntimeError):
    """The engine could not do what was asked; the message says what to do next."""


class NotServing(EngineError):
    """The engine did not come to serve the expected model; ``reason`` says why, in one clause."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EngineStartError(EngineError):
    """vLLM did not become ready; ``log_excerpt`` holds the lines that say why."""

    def __init__(self, message: str, log_excerpt: str = "") -> None:
        super().__init__(message + (f"\n--- engine log (relevant lines) ---\n{log_excerpt}" if log_excerpt else ""))
        self.message = message
        self.log_excerpt = log_excerpt


ERROR_PATTERN = re.compile(r"(error|exception|traceback|unrecognized|invalid|refused|not supported|"
                           r"out of memory|cannot|failed|killed)", re.IGNORECASE)


CAUSE_PATTERN = re.compile(r"\b\w*(Error|Exception): \S")  # a Python exception's message line


def log_excerpt(text: str, max_lines: int = 20) -> str:
    """The log lines that explain a failure: the first exception messages (the root cause, often in a
    worker process, before the cascade of "initialization failed" lines), the last matching error
    lines, then the last few lines."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    usage = [ln for ln in lines if ln.lstrip().startswith(("[", "usage:"))]  # argparse's usage block
    lines = [ln for ln in lines if ln not in usage]
    causes = list(dict.fromkeys(ln for ln in lines if CAUSE_PATTERN.search(ln)))[:3]
    hits = [ln for ln in lines if ERROR_PATTERN.search(ln) and "Warning" not in ln and ln not in causes]
    tail = [ln for ln in lines[-5:] if ln not in causes]
    room = max(0, max_lines - len(causes) - len(tail))
    chosen = causes + (hits[-room:] if room else []) + [ln for ln in tail if ln not in hits]
    return "\n".join(chosen)


# ---------------------------------------------------------------- the interface

class Engine(ABC):
    """The engine interface the notebooks use; backends differ only in how they restart."""

    reconfigurable = True  # False: the flags and the model are set where the engine runs, not from here

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @abstractmethod
    def config(self) -> EngineConfig:
        """The configuration the engine runs now (or will run on its next start)."""

    @abstractmethod
    def apply(self, config: EngineConfig, timeout_s: float | None = None) -> None:
        """Restart on a new configuration; on failure restore the last good one and raise."""

    @abstractmethod
    def logs(self, lines: int = 50) -> str:
        """The last lines of the engine's log."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the engine."""

    # The methods below are the same for every backend.
    def args(self) -> list[str]:
        """The current vLLM command-line flags."""
        return list(self.config().args)

    @property
    def model(self) -> str:
        """The model name clients send (``served_name``)."""
        return self.config().served_name

    def set_flag(self, flag: str, value: Any = True, timeout_s: float | None = None) -> None:
        """Set one vLLM flag and restart on it: True writes the bare flag, False its ``--no-`` form, None removes it."""
        config = self.config()
        self.apply(replace(config, args=with_flag(config.args, flag, value)), timeout_s)

    def set_env(self, name: str, value: str | None, timeout_s: float | None = None) -> None:
        """Set one environment variable of the engine process (``None`` removes it) and restart."""
        env = dict(self.config().env)
        env.pop(name, None)
        if value is not None:
            env[name] = str(value)
        self.apply(replace(self.config(), env=tuple(sorted(env.items()))), timeout_s)

    def switch_model(self, model: str, served_name: str | None = None, timeout_s: float | None = None) -> None:
        """Serve another model (a shipped tiny model's name, a local directory or a hub id)."""
        target = resolve_model(model, self.settings.profile)
        self.apply(replace(self.config(), model=target, served_name=served_name or model), timeout_s)

    def restart(self, timeout_s: float | None = None) -> None:
        """Restart on the current configuration."""
        self.apply(self.config(), timeout_s)

    def served_models(self, timeout_s: float = 3.0) -> list[str]:
        """The model names ``/v1/models`` lists now; raises httpx errors when unreachable."""
        return list_models(self.settings, timeout_s)

    def is_ready(self) -> bool:
        """True when ``/v1/models`` lists the expected model."""
        try:
            return self.model in self.served_models()
        except (httpx.HTTPError, ValueError):
            return False

    def status(self) -> dict[str, Any]:
        """Endpoint, model, flags, what the server itself lists, readiness and, when not ready, why; no secrets."""
        status: dict[str, Any] = {**self.settings.describe(), "model": self.model, "args": self.args()}
        try:
            served = self.served_models()
            status["served"] = served
            status["ready"] = self.model in served
            if not status["ready"]:
                status["problem"] = f"the endpoint serves {served}, not {self.model!r}"
        except (httpx.HTTPError, ValueError) as err:
            status["ready"] = False
            refused = auth_error(err)
            status["problem"] = (str(refused) if refused else
                                 f"cannot reach {self.settings.base_url}/models ({type(err).__name__}: {err})")
        return status

    ready_poll_s = 1.0  # between two /v1/models requests while waiting

    def wait_serving(self, expected: str, deadline: float, timeout_s: float,
                     gone: Callable[[], str | None] = lambda: None, on_poll: Callable[[], None] = lambda: None) -> None:
        """Poll ``/v1/models`` until it lists ``expected``, then generate one token with it.

        Raises ``NotServing`` when the engine lists another model, cannot generate, is ``gone()`` (a reason,
        e.g. the process exited) or is not ready by ``deadline`` (``time.monotonic()``); a refused API
        key raises at once, since it is not "not ready yet". ``on_poll`` runs before each poll (a progress display).
        """
        while True:
            on_poll()
            try:
                served = self.served_models(timeout_s=3.0)
            except (httpx.HTTPError, ValueError) as err:
                refused = auth_error(err)
                if refused:
                    raise refused from None
                served = []
            if expected in served:
                error = first_token_error(self.settings, expected)
                if error:
                    raise NotServing(f"the engine lists {expected!r} but could not generate a token ({error})")
                return
            if served:
                raise NotServing(f"the engine serves {served}, not {expected!r}")
            why = gone()
            if why:
                raise NotServing(why)
            if time.monotonic() >= deadline:
                raise NotServing(f"{self.settings.base_url}/models did not list {expected!r} within {timeout_s:.0f} s")
            time.sleep(self.ready_poll_s)


def list_models(settings: Settings, timeout_s: float = 3.0) -> list[str]:
    """The model names the endpoint's ``/v1/models`` lists; raises httpx errors (HTTPStatusError on 4xx/5xx)."""
    resp = httpx.get(settings.base_url + "/models", headers=settings.auth_headers(), timeout=timeout_s)
    resp.raise_for_status()
    return [m["id"] for m in resp.json().get("data", [])]


def first_token_error(settings: Settings, model: str, timeout_s: float = 120.0) -> str | None:
    """None when the endpoint generates one token for ``model``; otherwise why not, in one line."""
    try:
        resp = httpx.post(settings.base_url + "/completions", headers=settings.auth_headers(), timeout=timeout_s,
                          json={"model": model, "prompt": "hi", "max_tokens": 1})
    except httpx.HTTPError as err:
        return f"{type(err).__name__}: {err}"
    if resp.status_code == 200:
        return None
    try:
        detail = resp.json().get("error", {}).get("message") or resp.text
    except ValueError:
        detail = resp.text
    return f"HTTP {resp.status_code}: {str(detail).strip()[:200]}"


def auth_error(err: Exception) -> EngineError | None:
    """A clear error for a refused API key (HTTP 401/403), which is not "not ready yet"."""
    if isinstance(err, httpx.HTTPStatusError) and err.response.status_code in (401, 403):
        return EngineError(f"The engine refused the API key (HTTP {err.response.status_code}): set VLLM_API_KEY to the "
                           "key the engine was started with (your instructor has it), then restart the kernel.")
    return None


def shipped_models() -> list[str]:
    """The names of the models in ``models/`` (each a directory with a ``config.json``)."""
    root = models_dir()
    return sorted(p.name for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []


def resolve_model(model: str, profile: str) -> str:
    """What vLLM is given for a model name: on the CPU profile a shipped model's directory, a local directory as it
    is, a hub id (``org/name``) as it is, any other name refused (nothing is downloaded there). On ``k8s`` the engine
    runs in its own pod, which reads only the room's model volume: a name is passed as it is, and a shipped tiny
    model's name or a directory of this machine (the notebook pod) is refused. On ``gpu`` (a local engine) a local
    directory works, but a shipped tiny model's name is refused: the GPU lessons serve the room's hub ids."""
    path = models_dir() / model
    if profile != "cpu":
        local = "/" not in model and path.is_dir()  # a shipped name (a path would make models_dir() / model that path)
        if local or (profile == "k8s" and Path(model).expanduser().is_dir()):
            where = "is a tiny model shipped for the CPU profile" if local else "is a directory of this machine"
            raise EngineError(f"Model {model!r} {where}, which the {profile} engine cannot serve: name a hub id the "
                              f"room downloaded ({', '.join(ROOM_MODELS)}), e.g. through helpers.core.models."
                              "lesson_model, or switch to the CPU profile (WORKSHOP_PROFILE=cpu) for the tiny models.")
        return model
    if path.is_dir():
        return str(path)
    if Path(model).expanduser().is_dir() or re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        return model
    raise EngineError(f"Model {model!r} is neither a model shipped in models/ ({', '.join(shipped_models())}) nor a "
                      "local directory (nor a hub id such as Qwen/Qwen3-0.6B, which needs the network). Set MODEL_NAME "
                      "to one of the shipped models, or unset it for tiny-agent.")


def default_config(settings: Settings) -> EngineConfig:
    """The baseline configuration of a profile (what ``workshop up`` starts)."""
    tool_flags = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    if settings.profile == "cpu":
        model = settings.model
        return EngineConfig(
            model=resolve_model(model, settings.profile),
            served_name=model,
            # eager mode: starts ~10 s sooner than torch.compile on 2 cores (see README, "CPU engine")
            args=("--max-model-len", "4096", "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES),
                  "--enforce-eager", *tool_flags,
                  # tiny-qwen3 thinks, under Qwen3-4B's own template: served as the gpu profile serves Qwen3
                  *(("--reasoning-parser", "qwen3") if model == TINY_QWEN3 else ())),
            env=CPU_ENGINE_ENV,
        )
    return EngineConfig(
        model=settings.model, served_name=settings.model,
        args=("--max-model-len", "8192", "--max-num-seqs", "32", "--gpu-memory-utilization", "0.90",
              *tool_flags, "--reasoning-parser", "qwen3"),
    )


class ExternalEngine(Engine):
    """An endpoint someone else runs (``VLLM_HOST`` without a cluster backend): read-only."""

    reconfigurable = False

    def config(self) -> EngineConfig:
        return EngineConfig(model=self.settings.model, served_name=self.settings.model)

    def apply(self, config: EngineConfig, timeout_s: float | None = None) -> None:
        raise EngineError(f"{self.settings.base_url} is an external endpoint: its flags are set where it runs. "
                          "Use the local engine (unset VLLM_HOST) or the cluster profile to change them.")

    def logs(self, lines: int = 50) -> str:
        return "(the log of an external endpoint is not available here)"

    def stop(self) -> None:
        raise EngineError("An external endpoint is not stopped from here.")
