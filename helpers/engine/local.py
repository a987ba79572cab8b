"""The engine as a vLLM server process on this machine, with one owner per port.

``LocalEngine`` keeps what it knows in ``engine-PORT.json`` in the state directory, so ``workshop up`` in a
shell and a notebook kernel share one engine: the server's PID, its start time and command line, the
configuration it serves and the last configuration that became ready.

- **One owner per port.** Start, stop and every restart hold an ``fcntl`` lock on ``engine-PORT.lock``:
  two processes starting at once get one engine (the second waits, then finds it ready).
- **A PID is checked before it is signalled.** The recorded PID is ours only while a process with that
  PID has the recorded start time (a reused PID has another). A stale or damaged state file is reported
  and nothing in it is signalled.
- **Stop ends the whole engine.** The server leads its own session; stop ends every process of that
  session (the engine core too, also when the server itself was killed with ``kill -9``) and checks that
  the port is free.
- **A lost state file loses nothing.** The server carries this state file's path and its configuration
  in its environment, so the server holding the port is recognised as ours and adopted; any other
  program on the port is named and never touched.
- **Never a zombie.** A short-lived launcher starts the server, so it is not a child of whoever started
  it (``workshop lab`` turns itself into JupyterLab, which would never reap it).

Process facts come from psutil (vLLM depends on it): start times, command lines, environments and the
listening sockets, the same way on Linux and macOS.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import psutil
from tqdm.auto import tqdm

from helpers.engine.interface import (CPU_START_TIMEOUT_S, GPU_START_TIMEOUT_S, Engine, EngineError, EngineStartError, NotServing,
                            default_config, log_excerpt)
from helpers.engine.process import (STATE_MARK, STOP_TIMEOUT_S, describe_process, end_processes, launch_detached,
                                    port_holder, port_lock, process_if_alive, read_log, session_members)
from helpers.engine.spec_sampling_fix import engine_environment as fix_environment
from helpers.hardware.forced_isa import engine_environment
from helpers.hardware.machine import FORCE_ISA_VARIABLE
from helpers.core.settings import Settings, state_dir
from helpers.core.vllm_args import EngineConfig, config_from_args, server_args

CONFIG_MARK = "WORKSHOP_ENGINE_CONFIG"  # in the server's environment: the configuration it was started on
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
PORT_FREE_TIMEOUT_S = 10.0
# Every start is one JSON line appended here (the state directory's engine-starts.jsonl unless this names another
# file): when it began and ended, how long it took, whether it became ready. The test suite's time table reads it.
START_RECORD_VARIABLE = "WORKSHOP_ENGINE_STARTS"
# What the server's log says it is doing, in order (vLLM 0.32's log lines); the last one seen is the phase.
START_PHASES = (
    ("non-default args:", "reading its arguments"),
    ("Initializing a V1 LLM engine", "starting the engine core"),
    ("Starting to load model", "loading the weights"),
    ("Loading weights took", "allocating the KV cache"),
    ("KV cache size:", "profiling and warming up"),
    ("init engine (profile, create kv cache, warmup model) took", "starting the HTTP server"),
    ("Starting vLLM server on", "generating a first token"),
)




def start_phase(log_text: str) -> str:
    """Where a starting server is, from its log since the start: the last phase whose line has appeared."""
    phase = "starting Python and importing vLLM"
    for marker, name in START_PHASES:
        if marker in log_text:
            phase = name
    return phase




















def start_record_path() -> Path:
    """The JSON-lines file every engine start is appended to (``WORKSHOP_ENGINE_STARTS`` overrides)."""
    return Path(os.environ.get(START_RECORD_VARIABLE) or state_dir() / "engine-starts.jsonl")


@contextmanager
def recorded_start(port: int, config: EngineConfig) -> Iterator[Callable[[], None]]:
    """Time one start (spawn to ready) and append it to ``start_record_path()``, ready or not, once the function it
    gives was called when the server was launched (a start refused before, on a busy port, is no start)."""
    began, launched, ready = time.time(), [], False
    try:
        yield lambda: launched.append(True)
        ready = True
    finally:
        if launched:
            _append_start({"began": began, "ended": time.time(), "ready": ready, "port": port,
                           "model": config.served_name, "args": list(config.args), "server": SERVER_MODULE,
                           "starter_pid": os.getpid()})


def _append_start(line: dict[str, Any]) -> None:
    line["seconds"] = round(line["ended"] - line["began"], 3)
    try:
        path = start_record_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:  # one short write per line: appends from several processes stay whole
            fh.write(json.dumps(line) + "\n")
    except OSError:
        pass  # a record that cannot be written costs the table a line, never the start


# ---------------------------------------------------------------- state on disk

@dataclass
class _State:
    pid: int | None = None
    create_time: float | None = None  # the server's start time (psutil), to tell it from a reused PID
    cmdline: list[str] | None = None
    config: dict[str, Any] | None = None
    last_good: dict[str, Any] | None = None
    started_at: float | None = None
    log_offset: int = 0


def _valid_config(data: Any) -> bool:
    try:
        EngineConfig.from_json(data)
        return isinstance(data["model"], str) and isinstance(data["served_name"], str)
    except (KeyError, TypeError, AttributeError, ValueError):
        return False


def parse_state(text: str) -> tuple[_State, str | None]:
    """The state in a state file's text, and what was wrong with it (None when nothing was)."""
    try:
        data = json.loads(text)
    except ValueError as err:
        return _State(), f"not JSON ({err})"
    if not isinstance(data, dict):
        return _State(), "not a JSON object"
    known = {f.name for f in fields(_State)}
    state = _State(**{k: v for k, v in data.items() if k in known})
    problems = []
    if state.pid is not None and (not isinstance(state.pid, int) or isinstance(state.pid, bool)):
        problems.append(f"pid {state.pid!r} is not a process ID")
        state.pid = None
    if state.create_time is not None and not isinstance(state.create_time, (int, float)):
        problems.append("its start time is not a number")
        state.create_time = None
    for name in ("config", "last_good"):
        if getattr(state, name) is not None and not _valid_config(getattr(state, name)):
            problems.append(f"{name} is not a configuration")
            setattr(state, name, None)
    if not isinstance(state.log_offset, int):
        state.log_offset = 0
    return state, "; ".join(problems) or None


# ---------------------------------------------------------------- the backend

class LocalEngine(Engine):
    """A vLLM server run by the helpers on this machine, owned through its state file and port lock."""

    # A start polls this machine's own port: a refused connection costs nothing, and a start (about 14 s on the CPU)
    # is seen ready 0.1 s after vLLM answers instead of 0.5 s on average at the base class's 1 s.
    ready_poll_s = 0.2

    def __init__(self, settings: Settings) -> None:
        if not settings.managed:
            raise EngineError(f"{settings.base_url} is an external endpoint (VLLM_HOST is set); "
                              "the helpers cannot restart it. Unset VLLM_HOST to use the local engine.")
        super().__init__(settings)
        self._state_path = state_dir() / f"engine-{settings.port}.json"
        self._lock = port_lock(state_dir() / f"engine-{settings.port}.lock")
        self.state_problem: str | None = None  # what was wrong with the state file when it was read

    # ---- state
    def _load(self) -> _State:
        """The state file, checked; a damaged or missing one is replaced by what the server on the port says."""
        try:
            state, problem = parse_state(self._state_path.read_text())
        except FileNotFoundError:
            state, problem = _State(), "missing"
        except OSError as err:
            state, problem = _State(), f"unreadable ({err.strerror})"
        server = process_if_alive(state.pid, state.create_time)
        if state.pid is not None and server is None:
            problem = (f"stale: the recorded server pid {state.pid} is gone or now another program; it was not "
                       "signalled")
        if server is None:
            adopted = self._adopt()
            if adopted is not None:
                adopted.last_good = state.last_good or adopted.config
                problem = f"{problem}; adopted the engine serving on port {self.settings.port} (pid {adopted.pid})"
                state = adopted
                self._save(state)
        if problem and problem != "missing":
            self.state_problem = problem  # kept until this object rewrites the state (stop, start)
        return state

    def _adopt(self) -> _State | None:
        """The state of the server on our port when it was started for this state file, else None."""
        busy, pid = port_holder(self.settings.port)
        if not busy or pid is None:
            return None
        try:
            proc = psutil.Process(pid)
            env = proc.environ()
            if env.get(STATE_MARK) != str(self._state_path):
                return None
            config = json.loads(env.get(CONFIG_MARK, "null"))
            if not _valid_config(config):
                found = config_from_args(proc.cmdline()[3:], drop=("--host", "--port"))
                config = found.to_json() if found else None
            sid = os.getsid(pid)
            leader = psutil.Process(sid) if sid != pid else proc
            return _State(pid=leader.pid, create_time=leader.create_time(), cmdline=leader.cmdline(), config=config)
        except (psutil.Error, OSError, ValueError):
            return None

    def _save(self, state: _State) -> None:
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=1))
        tmp.replace(self._state_path)

    def _server(self, state: _State | None = None) -> psutil.Process | None:
        state = state or self._load()
        return process_if_alive(state.pid, state.create_time)

    def _locked(self, timeout_s: float | None = None):
        return self._lock.held(self._start_timeout(timeout_s) + 120, self.settings.port)

    def _start_timeout(self, timeout_s: float | None) -> float:
        return timeout_s or (CPU_START_TIMEOUT_S if self.settings.profile == "cpu" else GPU_START_TIMEOUT_S)

    # ---- what is running
    def config(self) -> EngineConfig:
        state = self._load()
        if state.config and self._server(state):
            return EngineConfig.from_json(state.config)
        return default_config(self.settings)

    @property
    def pid(self) -> int | None:
        """The server's process id while our server runs."""
        proc = self._server()
        return proc.pid if proc else None

    def status(self) -> dict[str, Any]:
        status = super().status()
        state = self._load()
        server = self._server(state)
        status["pid"] = server.pid if server else None
        if server:
            try:  # the flags the process really runs with, not only what the file says
                found = config_from_args(server.cmdline()[3:], drop=("--host", "--port"))
                if found:
                    status["args"] = list(found.args)
            except psutil.Error:
                pass
        busy, holder = port_holder(self.settings.port)
        if server:
            status["port"] = f"{self.settings.port}: our engine (pid {server.pid})"
        elif busy:
            status["port"] = (f"{self.settings.port}: held by {describe_process(holder)}, not an engine the helpers "
                              "started; `workshop up` will not start here (stop that program, or set WORKSHOP_PORT)")
        else:
            status["port"] = f"{self.settings.port}: free (no engine running)"
        if self.state_problem:
            status["state_file"] = f"{self._state_path.name}: {self.state_problem}"
        return status

    def log_path(self) -> Path:
        return state_dir() / f"engine-{self.settings.port}.log"

    def logs(self, lines: int = 50) -> str:
        try:
            text = self.log_path().read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ---- start, stop, restart
    def start(self, config: EngineConfig | None = None, timeout_s: float | None = None) -> None:
        """Start the server unless ours already serves this configuration; wait until ready.

        Without ``config``: the running server's configuration, unless it serves another model than the
        settings ask for (MODEL_NAME), then the profile's default configuration for that model.
        """
        with self._locked(timeout_s):
            state = self._load()
            server = self._server(state)
            running = EngineConfig.from_json(state.config) if server and state.config else None
            wanted = config or running or default_config(self.settings)
            if config is None and running and running.served_name != self.settings.model:
                wanted = default_config(self.settings)
                print(f"The engine on port {self.settings.port} serves {running.served_name!r}; the settings ask for "
                      f"{self.settings.model!r} (MODEL_NAME): restarting on it.", flush=True)
            if running == wanted:
                self.wait_ready(timeout_s)
                return
            self.stop()
            with recorded_start(self.settings.port, wanted) as launched:
                self._spawn(wanted)
                launched()
                self.wait_ready(timeout_s)
            state = self._load()
            state.last_good = wanted.to_json()
            self._save(state)

    def _ensure_port_free(self) -> None:
        busy, holder = port_holder(self.settings.port)
        if busy:
            raise EngineError(f"Port {self.settings.port} is already in use by {describe_process(holder)}, which the "
                              f"helpers did not start; nothing was started. Stop it, or choose another port: export "
                              f"WORKSHOP_PORT={self.settings.port + 1} (and restart the notebook kernel).")

    def _spawn(self, config: EngineConfig) -> None:
        self._ensure_port_free()
        cmd = [sys.executable, "-m", SERVER_MODULE, *server_args(config), "--host", "127.0.0.1",
               "--port", str(self.settings.port)]
        env = {k: v for k, v in os.environ.items() if k not in ("VLLM_HOST", "VLLM_PORT", "VLLM_API_KEY")}
        if self.settings.api_key:
            env["VLLM_API_KEY"] = self.settings.api_key  # read by vLLM; keeps the key off the command line
        env.update(dict(config.env))
        env.update(engine_environment(os.environ.get(FORCE_ISA_VARIABLE), env))  # run as another CPU kind would
        env.update(fix_environment(env))  # vllm#55006, when the configuration's env switches it on (notebook 06)
        env[STATE_MARK], env[CONFIG_MARK] = str(self._state_path), json.dumps(config.to_json())
        text, offset = launch_detached(cmd, env, self.log_path(),
                                       f"{config.served_name} {' '.join(config.args)}")
        if not text.isdigit():
            raise EngineStartError("The engine's launcher could not start vLLM.", self._recent_log_excerpt(offset))
        proc = psutil.Process(int(text))
        state = self._load()
        state.pid, state.create_time, state.cmdline = proc.pid, proc.create_time(), cmd
        state.config, state.started_at, state.log_offset = config.to_json(), time.time(), offset
        self._save(state)

    def wait_ready(self, timeout_s: float | None = None, progress: bool = True) -> None:
        """Block until ``/v1/models`` lists the expected model and one token is generated; raise with the
        log if the server dies or cannot generate. ``progress``: show the start's phase and elapsed time
        (a widget in JupyterLab, a status line in a terminal; none when output is not a terminal)."""
        timeout_s = self._start_timeout(timeout_s)
        state = self._load()
        if not self._server(state):
            raise EngineError("The local engine is not running. Start it with `workshop up` or engine.start().")
        expected = EngineConfig.from_json(state.config).served_name if state.config else self.model

        def gone() -> str | None:
            return None if process_if_alive(state.pid, state.create_time) else "vLLM exited before it became ready"

        with tqdm(total=None, desc=f"engine {expected}", bar_format="{desc} [{elapsed}]", leave=False,
                  disable=None if progress else True) as bar:
            def show_phase() -> None:  # in the description: tqdm puts ", " before a postfix
                bar.set_description_str(f"engine {expected}: {start_phase(self._recent_log_text(state.log_offset))}",
                                        refresh=True)

            try:
                self.wait_serving(expected, time.monotonic() + timeout_s, timeout_s, gone, show_phase)
            except NotServing as err:
                if "could not generate" in err.reason:
                    time.sleep(0.5)  # let the server's log take the traceback of the failed step
                raise EngineStartError(f"vLLM is not serving: {err.reason}.", self._recent_log_excerpt()) from None

    def _recent_log_text(self, offset: int) -> str:
        return read_log(self.log_path(), offset)

    def _recent_log_excerpt(self, offset: int | None = None) -> str:
        return log_excerpt(self._recent_log_text(self._load().log_offset if offset is None else offset))

    def apply(self, config: EngineConfig, timeout_s: float | None = None) -> None:
        with self._locked(timeout_s):
            previous = self._load().last_good
            self.stop()
            try:
                with recorded_start(self.settings.port, config) as launched:
                    self._spawn(config)
                    launched()
                    self.wait_ready(timeout_s)
            except EngineStartError as err:
                self.stop()
                if previous and previous != config.to_json():
                    with recorded_start(self.settings.port, EngineConfig.from_json(previous)) as launched:
                        self._spawn(EngineConfig.from_json(previous))
                        launched()
                        self.wait_ready(timeout_s)
                    raise EngineStartError(f"The new configuration failed ({err.message}); the engine is back on the "
                                           f"last good one ({' '.join(previous['args'])}).", err.log_excerpt) from None
                raise
            state = self._load()
            state.last_good = config.to_json()
            self._save(state)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """End our server and every process of its session, then check that the port is free."""
        with self._locked():
            state = self._load()
            server = self._server(state)
            procs = session_members(state.pid, state.create_time, str(self._state_path)) if state.pid and state.create_time else []
            if state.pid and not server and procs:  # the server was killed; its engine core lives on
                print(f"ending {len(procs)} leftover process(es) of the engine that ran as pid {state.pid}", flush=True)
            if server and server not in procs:
                procs.append(server)
            survivors = end_processes(procs, timeout_s) if procs else []
            state.pid = state.create_time = state.cmdline = None
            self._save(state)
            self.state_problem = None
            if survivors:
                raise EngineError(f"{', '.join(describe_process(p.pid) for p in survivors)} of the engine survived "
                                  "SIGKILL: check `ps` for a process stuck in the kernel (state D).")
            if not procs:
                return
            deadline = time.monotonic() + PORT_FREE_TIMEOUT_S
            while (holder := port_holder(self.settings.port))[0]:
                if time.monotonic() > deadline:
                    raise EngineError(f"Our engine stopped, but port {self.settings.port} is still held by "
                                      f"{describe_process(holder[1])}.")
                time.sleep(0.2)
