"""Processes and ports on this machine, as the local engine and the router handle them: one owner per port.

- A recorded PID is ours only while a process with that PID has the recorded start time (``process_if_alive``).
- A server leads its own session; stopping it ends every process of that session (``session_members``,
  ``end_processes``).
- A short-lived launcher starts a server so it is no child of whoever started it (``launch_detached``).
- Start, stop and restart hold an ``fcntl`` lock per port (``port_lock``).
- A server's log is read from where its last start began (``read_log``).

Process facts come from psutil (vLLM depends on it): start times, command lines, environments and the listening
sockets, the same way on Linux and macOS.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from helpers.engine.interface import EngineError

STATE_MARK = "WORKSHOP_ENGINE_STATE"  # in the server's environment: the state file that owns it


START_TIME_TOLERANCE_S = 0.05  # psutil's start times come from clock ticks (10 ms)


STOP_TIMEOUT_S = 30.0


# The launcher starts the server in a new session, writes its PID to a pipe and exits at once.
LAUNCHER = ("import os, subprocess, sys; p = subprocess.Popen(sys.argv[2:], start_new_session=True); "
            "os.write(int(sys.argv[1]), str(p.pid).encode())")


def process_if_alive(pid: Any, create_time: Any) -> psutil.Process | None:
    """The running process with this PID and start time; None when it is gone, a zombie, or the PID was reused."""
    if not isinstance(pid, int) or not isinstance(create_time, (int, float)) or pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > START_TIME_TOLERANCE_S or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def _is_engine_process(proc: psutil.Process, state_path: str) -> bool:
    """A process the server started: it carries the state file's mark, or vLLM's name (the engine core renames
    itself ``VLLM::EngineCore``, which overwrites what ``/proc`` shows of its environment)."""
    try:
        if proc.environ().get(STATE_MARK) == state_path:
            return True
    except psutil.Error:
        pass
    try:
        return "vllm" in " ".join(proc.cmdline()).lower()
    except psutil.Error:
        return False


def session_members(sid: int, born: float, state_path: str) -> list[psutil.Process]:
    """The live engine processes of the session our server (PID ``sid``, started at ``born``) leads, also
    after the server itself is gone. A session's ID is not reused while one of its processes lives; when
    the PID ``sid`` now belongs to another program, the session is not ours and nothing is returned."""
    try:
        leader = psutil.Process(sid)
        if abs(leader.create_time() - born) > START_TIME_TOLERANCE_S:
            return []
    except psutil.Error:
        pass  # the server is gone; its session may live on in its children
    members = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE \
                    and proc.create_time() >= born - START_TIME_TOLERANCE_S and _is_engine_process(proc, state_path):
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    return members


def port_holder(port: int) -> tuple[bool, int | None]:
    """(someone listens on the TCP port, their PID when this user may see it)."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return True, conn.pid
    except psutil.AccessDenied:  # macOS without root: fall back to connecting
        pass
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0, None


def describe_process(pid: int | None) -> str:
    """``pid 123 (python3)``: the PID and program name only (a command line may hold a secret)."""
    if pid is None:
        return "a process this user cannot see (another user's, or a container's)"
    try:
        return f"pid {pid} ({psutil.Process(pid).name()})"
    except psutil.Error:
        return f"pid {pid}"


def end_processes(procs: list[psutil.Process], timeout_s: float = STOP_TIMEOUT_S) -> list[psutil.Process]:
    """SIGTERM, wait up to ``timeout_s``, SIGKILL what is left; returns the processes that survived that."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=5)
    return alive


class _PortLock:
    """An ``fcntl`` lock on a file, re-entrant within this process (start calls stop, apply calls both)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread_lock = threading.RLock()
        self._fd: int | None = None
        self._depth = 0

    @contextmanager
    def held(self, timeout_s: float, port: int) -> Iterator[None]:
        if not self._thread_lock.acquire(timeout=timeout_s):
            raise EngineError(f"Another thread of this process kept the engine on port {port} busy for {timeout_s:.0f} s.")
        try:
            if self._depth == 0:
                self._fd = self._acquire(timeout_s, port)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    os.close(self._fd)
                    self._fd = None
        finally:
            self._thread_lock.release()

    def _acquire(self, timeout_s: float, port: int) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        started = time.monotonic()
        deadline, told = started + timeout_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                if not holder and time.monotonic() - started < 2:
                    time.sleep(0.05)  # the holder has the lock but has not written its pid yet
                    continue
                holder = holder or "another process"
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise EngineError(f"{holder} has been starting or stopping the engine on port {port} for more than "
                                      f"{timeout_s:.0f} s. Wait for it, or stop it; then try again.") from None
                if not told:
                    print(f"waiting for {holder}, which is starting or stopping the engine on port {port}", flush=True)
                    told = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        return fd


def launch_detached(cmd: list[str], env: dict[str, str], log_path: Path, what: str) -> tuple[str, int]:
    """Start ``cmd`` through the launcher, so it is no child of this process (it outlives a notebook kernel),
    its output appended to ``log_path`` after a header naming ``what``; returns (the pid as the launcher
    reported it, "" when it failed; the log's offset where this start begins)."""
    with log_path.open("ab") as log:
        offset = log.tell()
        log.write(f"\n=== starting {time.strftime('%Y-%m-%d %H:%M:%S')}: {what}\n".encode())
        log.flush()
        read_end, write_end = os.pipe()
        try:
            launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(write_end), *cmd], stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                        pass_fds=(write_end,))
            os.close(write_end)
            launcher.wait(timeout=60)
            return os.read(read_end, 32).decode(), offset
        finally:
            os.close(read_end)


_LOCKS: dict[Path, _PortLock] = {}


_LOCKS_GUARD = threading.Lock()


def port_lock(path: Path) -> _PortLock:
    """The one lock object of this process for a lock file."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(path, _PortLock(path))


def read_log(path: Path, offset: int = 0) -> str:
    """A log file's text from byte ``offset`` on (where a start began); "" when it cannot be read."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""
