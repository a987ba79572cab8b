"""One engine interface, with interchangeable backends.

``Engine`` is what notebooks use: read the current arguments, set one flag, switch model, restart,
wait until ready, tail the log, stop. ``LocalEngine`` runs a real vLLM OpenAI-compatible server as a
child process (vLLM's CPU build without a GPU, ``vllm`` with one); a Kubernetes backend patches the
participant's Deployment behind the same methods. Notebooks never branch on where the engine runs.

Ready means ``/v1/models`` lists the expected model and the engine has generated one token for it,
not merely that ``/health`` answers: a configuration can start and still fail on its first request
(a kernel this CPU lacks). A restart with new flags that fails, at start or at that first token, shows
the relevant log lines and brings the engine back on the last good configuration.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from helpers.forced_isa import engine_environment
from helpers.machine import FORCE_ISA_VARIABLE
from helpers.settings import GPU_MODEL, TINY_AGENT, Settings, models_dir, state_dir

CPU_KV_CACHE_BYTES = 1 << 30  # 1 GiB of KV cache: on vLLM's CPU build this must be set explicitly
# The model runs inside the engine-core process instead of a separate worker process. With a worker,
# the engine core's main thread waits for each step in a sched_yield loop (vllm/distributed/
# device_communicators/shm_broadcast.py, SpinCondition.wait) that keeps taking the GIL back, so on a
# machine with few free cores its output thread can starve until the engine goes idle: a request's
# whole stream then arrives at once, at its end. On 2 cores that hit 2 to 18 of 32 requests in each of 4
# runs of `vllm bench serve` (TTFT ~0.5 s instead of ~17 ms); in-process, none in 5 runs (README, profiles).
CPU_ENGINE_ENV = (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),)
CPU_START_TIMEOUT_S = 300.0
GPU_START_TIMEOUT_S = 1200.0


class EngineError(RuntimeError):
    """The engine could not do what was asked; the message says what to do next."""


class EngineStartError(EngineError):
    """vLLM did not become ready; ``log_excerpt`` holds the lines that say why."""

    def __init__(self, message: str, log_excerpt: str = "") -> None:
        super().__init__(message + (f"\n--- engine log (relevant lines) ---\n{log_excerpt}" if log_excerpt else ""))
        self.message = message
        self.log_excerpt = log_excerpt


@dataclass(frozen=True)
class EngineConfig:
    """What to serve and how: the model, the name clients use, and vLLM's command-line flags."""

    model: str
    served_name: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "served_name": self.served_name, "args": list(self.args), "env": dict(self.env)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "EngineConfig":
        return cls(data["model"], data["served_name"], tuple(data.get("args", ())),
                   tuple(sorted(data.get("env", {}).items())))


# ---------------------------------------------------------------- flags (pure functions)

def _flag_name(flag: str) -> str:
    flag = flag.strip()
    if not flag.startswith("--"):
        flag = "--" + flag
    return flag.split("=", 1)[0].replace("_", "-")


def _split_flags(args: tuple[str, ...] | list[str]) -> list[list[str]]:
    """Group an argument list into [flag, value?] items (``--a=b`` stays one item)."""
    items: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not items:
            items.append([token])
        else:
            items[-1].append(token)
    return items


def flag_value(args: tuple[str, ...] | list[str], flag: str) -> str | bool | None:
    """A flag's value in an argument list: its string, True for a bare flag, None when absent."""
    name = _flag_name(flag)
    for item in _split_flags(args):
        head = item[0]
        if _flag_name(head) == name:
            if "=" in head:
                return head.split("=", 1)[1]
            return item[1] if len(item) > 1 else True
    return None


def with_flag(args: tuple[str, ...] | list[str], flag: str, value: Any = True) -> tuple[str, ...]:
    """The argument list with one flag replaced or appended; ``None``/``False`` removes it.

    Values that are dicts or lists (``--speculative-config``) are written as JSON.
    """
    name = _flag_name(flag)
    kept = [item for item in _split_flags(args) if _flag_name(item[0]) != name]
    if value is not None and value is not False:
        if value is True:
            kept.append([name])
        else:
            text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
            kept.append([name, text])
    return tuple(token for item in kept for token in item)


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
        """Set one vLLM flag (``None``/``False`` removes it) and restart on it."""
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
        path = models_dir() / model
        target = str(path) if path.is_dir() else model
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
        """Endpoint, model, flags and readiness, safe to print (no secrets)."""
        return {**self.settings.describe(), "model": self.model, "args": self.args(), "ready": self.is_ready()}


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


def default_config(settings: Settings) -> EngineConfig:
    """The baseline configuration of a profile (what ``workshop up`` starts)."""
    tool_flags = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    if settings.profile == "cpu":
        model = settings.model
        path = models_dir() / model
        return EngineConfig(
            model=str(path) if path.is_dir() else model,
            served_name=model,
            # eager mode: starts ~10 s sooner than torch.compile on 2 cores (see README, "CPU engine")
            args=("--max-model-len", "4096", "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES),
                  "--enforce-eager", *tool_flags),
            env=CPU_ENGINE_ENV,
        )
    return EngineConfig(
        model=settings.model, served_name=settings.model,
        args=("--max-model-len", "8192", "--max-num-seqs", "32", "--gpu-memory-utilization", "0.90",
              *tool_flags, "--reasoning-parser", "qwen3"),
    )


# ---------------------------------------------------------------- local process backend

def _port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


@dataclass
class _State:
    pid: int | None = None
    config: dict[str, Any] | None = None
    last_good: dict[str, Any] | None = None
    started_at: float | None = None
    log_offset: int = 0


class LocalEngine(Engine):
    """A vLLM server run by the helpers as a child process on this machine."""

    def __init__(self, settings: Settings) -> None:
        if not settings.managed:
            raise EngineError(f"{settings.base_url} is an external endpoint (VLLM_HOST is set); "
                              "the helpers cannot restart it. Unset VLLM_HOST to use the local engine.")
        super().__init__(settings)
        self._state_path = state_dir() / f"engine-{settings.port}.json"
        self._proc: subprocess.Popen[bytes] | None = None

    # state on disk, so `workshop up` in a shell and a notebook kernel share one engine
    def _load(self) -> _State:
        try:
            return _State(**json.loads(self._state_path.read_text()))
        except (OSError, ValueError, TypeError):
            return _State()

    def _save(self, state: _State) -> None:
        self._state_path.write_text(json.dumps(asdict(state), indent=1))

    def config(self) -> EngineConfig:
        state = self._load()
        if state.config and _pid_alive(state.pid):
            return EngineConfig.from_json(state.config)
        return default_config(self.settings)

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        state = self._load()
        return state.pid if _pid_alive(state.pid) else None

    def log_path(self) -> Path:
        return state_dir() / f"engine-{self.settings.port}.log"

    def logs(self, lines: int = 50) -> str:
        try:
            text = self.log_path().read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self, config: EngineConfig | None = None, timeout_s: float | None = None) -> None:
        """Start the server unless one of ours already serves this configuration; wait until ready."""
        config = config or self.config()
        state = self._load()
        if _pid_alive(state.pid) and state.config == config.to_json():
            self.wait_ready(timeout_s)
            return
        if _pid_alive(state.pid):
            self.stop()
        if _port_in_use(self.settings.port):
            raise EngineError(f"Port {self.settings.port} is already in use by another program. Stop it, or "
                              f"choose another port: export WORKSHOP_PORT=8001 (and restart the notebook kernel).")
        self._spawn(config)
        self.wait_ready(timeout_s)
        state = self._load()
        state.last_good = config.to_json()
        self._save(state)

    def _spawn(self, config: EngineConfig) -> None:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", config.model,
               "--served-model-name", config.served_name, "--host", "127.0.0.1",
               "--port", str(self.settings.port), *config.args]
        env = {k: v for k, v in os.environ.items() if k not in ("VLLM_HOST", "VLLM_PORT", "VLLM_API_KEY")}
        if self.settings.api_key:
            env["VLLM_API_KEY"] = self.settings.api_key  # read by vLLM; keeps the key off the command line
        env.update(dict(config.env))
        env.update(engine_environment(os.environ.get(FORCE_ISA_VARIABLE), env))  # run as another CPU kind would
        log = self.log_path().open("ab")
        offset = log.tell()
        log.write(f"\n=== starting {time.strftime('%Y-%m-%d %H:%M:%S')}: {config.served_name} "
                  f"{' '.join(config.args)}\n".encode())
        log.flush()
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env, start_new_session=True)
        log.close()
        state = self._load()
        state.pid, state.config, state.started_at, state.log_offset = self._proc.pid, config.to_json(), time.time(), offset
        self._save(state)

    def _exited(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is not None
        return not _pid_alive(self._load().pid)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until ``/v1/models`` lists the expected model and one token is generated; raise with the
        log if the server dies or cannot generate."""
        timeout_s = timeout_s or (CPU_START_TIMEOUT_S if self.settings.profile == "cpu" else GPU_START_TIMEOUT_S)
        deadline = time.monotonic() + timeout_s
        state = self._load()
        if not _pid_alive(state.pid):
            raise EngineError("The local engine is not running. Start it with `workshop up` or engine.start().")
        expected = EngineConfig.from_json(state.config).served_name if state.config else self.model
        while time.monotonic() < deadline:
            try:
                served = self.served_models(timeout_s=2.0)
                if expected in served:
                    self._check_first_token(expected)
                    return
                if served:
                    raise EngineError(f"The engine serves {served}, not {expected!r}.")
            except (httpx.HTTPError, ValueError) as err:
                refused = auth_error(err)
                if refused:
                    raise refused from None
            if self._exited():
                raise EngineStartError("vLLM exited before it became ready.", self._recent_log_excerpt())
            time.sleep(1.0)
        raise EngineStartError(f"vLLM was not ready after {timeout_s:.0f} s.", self._recent_log_excerpt())

    def _check_first_token(self, model: str) -> None:
        error = first_token_error(self.settings, model)
        if error:
            time.sleep(0.5)  # let the server's log take the traceback of the failed step
            raise EngineStartError(f"vLLM started and lists {model!r}, but could not generate a token ({error}): "
                                   "this configuration cannot serve here.", self._recent_log_excerpt())

    def _recent_log_excerpt(self) -> str:
        try:
            with self.log_path().open("rb") as fh:
                fh.seek(self._load().log_offset)
                return log_excerpt(fh.read().decode(errors="replace"))
        except OSError:
            return ""

    def apply(self, config: EngineConfig, timeout_s: float | None = None) -> None:
        previous = self._load().last_good
        self.stop()
        try:
            self._spawn(config)
            self.wait_ready(timeout_s)
        except EngineError as err:
            excerpt = getattr(err, "log_excerpt", "")
            reason = getattr(err, "message", str(err))
            self.stop()
            if previous and previous != config.to_json():
                self._spawn(EngineConfig.from_json(previous))
                self.wait_ready(timeout_s)
                raise EngineStartError(f"The new configuration failed ({reason}); the engine is back on the last good "
                                       f"one ({' '.join(previous['args'])}).", excerpt) from None
            raise
        state = self._load()
        state.last_good = config.to_json()
        self._save(state)

    def stop(self, timeout_s: float = 30.0) -> None:
        state = self._load()
        pid = state.pid
        if _pid_alive(pid):
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout_s
            while _pid_alive(pid) and time.monotonic() < deadline:
                if self._proc is not None and self._proc.pid == pid:
                    self._proc.poll()
                time.sleep(0.2)
            if _pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait(timeout=10)
            self._proc = None
        state.pid = None
        self._save(state)
        deadline = time.monotonic() + 10
        while _port_in_use(self.settings.port) and time.monotonic() < deadline:
            time.sleep(0.2)


class ExternalEngine(Engine):
    """An endpoint someone else runs (``VLLM_HOST`` without a cluster backend): read-only."""

    def config(self) -> EngineConfig:
        return EngineConfig(model=self.settings.model, served_name=self.settings.model)

    def apply(self, config: EngineConfig, timeout_s: float | None = None) -> None:
        raise EngineError(f"{self.settings.base_url} is an external endpoint: its flags are set where it runs. "
                          "Use the local engine (unset VLLM_HOST) or the cluster profile to change them.")

    def logs(self, lines: int = 50) -> str:
        return "(the log of an external endpoint is not available here)"

    def stop(self) -> None:
        raise EngineError("An external endpoint is not stopped from here.")


def make_engine(settings: Settings) -> Engine:
    """The backend for these settings: the participant's Deployment (k8s), a local process, or read-only external."""
    if settings.profile == "k8s":
        # imported here, not at the top: helpers.k8s_engine imports this module
        from helpers.k8s_engine import KubernetesEngine

        return KubernetesEngine(settings)
    if settings.managed:
        return LocalEngine(settings)
    return ExternalEngine(settings)
