"""One owner per port: the state file is checked, never trusted blindly; stop ends the whole engine.

The first tests use plain processes (``sleep``, a socket) in the engine's place; the ``engine`` ones start
the real local vLLM server on their own port and state directory.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from fakes import engine_environment, held_port
from helpers.engine.interface import EngineError, default_config
from helpers.engine.local import LocalEngine, parse_state, start_phase
from helpers.engine.process import STATE_MARK, end_processes, port_holder, port_lock, session_members
from helpers.engine.session import connect
from helpers.core.settings import load_settings, state_dir

PORT = int(os.environ.get("WORKSHOP_TEST_PORT", "8765")) + 7  # beside the integration suite's port


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- without vLLM

@pytest.mark.parametrize("text, problem", [
    ('{"pid": "abc"}', "pid 'abc' is not a process ID"),
    ('{"pid": 12', "not JSON"),
    ("", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"pid": 5, "config": {"model": 3}}', "config is not a configuration"),
])
def test_a_damaged_state_file_is_reported_not_a_traceback(text, problem):
    state, found = parse_state(text)
    assert problem in found and (state.pid is None or isinstance(state.pid, int))


def test_a_stale_pid_is_never_signalled(tmp_path):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        settings = load_settings({"WORKSHOP_PORT": str(_free_port())})
        engine = LocalEngine(settings)
        # the PID of a live process, but not the start time we recorded: a reused PID
        engine._state_path.write_text(json.dumps({"pid": victim.pid, "create_time": 1.0, "cmdline": ["vllm"],
                                                  "config": default_config(settings).to_json()}))
        assert engine.pid is None and "stale: the recorded server pid" in engine.state_problem
        engine.stop()
        assert victim.poll() is None, "stop() signalled a process that is not our engine"
        assert json.loads(engine._state_path.read_text())["pid"] is None  # the stale record is cleared
    finally:
        victim.kill()
        victim.wait()


def test_status_and_down_say_when_the_state_file_names_a_dead_or_reused_pid(capsys):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        settings = load_settings({"WORKSHOP_PORT": str(_free_port())})
        engine = LocalEngine(settings)
        engine._state_path.write_text(json.dumps({"pid": victim.pid, "create_time": 2.0}))
        status = engine.status()
        assert status["pid"] is None and "free" in status["port"]
        assert f"stale: the recorded server pid {victim.pid}" in status["state_file"]
    finally:
        victim.kill()
        victim.wait()


def test_a_port_held_by_another_program_refuses_start_and_restart_naming_it():
    with held_port() as port:
        engine = LocalEngine(load_settings({"WORKSHOP_PORT": str(port)}))
        status = engine.status()
        assert f"held by pid {os.getpid()}" in status["port"] and "not an engine the helpers started" in status["port"]
        for attempt in (lambda: engine.start(timeout_s=5), lambda: engine.restart(timeout_s=5),
                        lambda: engine.set_flag("--max-num-seqs", 4, timeout_s=5)):
            with pytest.raises(EngineError, match=f"Port {port} is already in use by pid {os.getpid()}.*nothing was started"):
                attempt()
        assert engine.pid is None and not engine.log_path().exists()  # no vLLM was launched


def test_a_second_process_waits_for_the_port_lock_and_names_its_holder(tmp_path):
    path = state_dir() / "engine-1.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
        "os.pwrite(fd, f'pid {os.getpid()}'.encode(), 0); print('locked', flush=True); time.sleep(30)"), str(path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(EngineError, match=f"pid {holder.pid} has been starting or stopping the engine on port 1"):
            with port_lock(path).held(timeout_s=0.5, port=1):
                pass
    finally:
        holder.kill()
        holder.wait()
    with port_lock(path).held(timeout_s=5, port=1):  # free again once its holder is gone
        with port_lock(path).held(timeout_s=5, port=1):  # and re-entrant within one process
            pass


def test_the_children_of_a_killed_server_are_found_by_its_session_and_ended(tmp_path):
    """What `kill -9` of the server leaves behind (its engine core) is still the engine's, and is ended."""
    mark = str(tmp_path / "engine-x.json")
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                              start_new_session=True, env={**os.environ, STATE_MARK: mark})
    child = int(leader.stdout.readline())
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True, env={**os.environ, STATE_MARK: mark})
    born = psutil.Process(leader.pid).create_time()
    try:
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()
        members = session_members(leader.pid, born, mark)
        assert [p.pid for p in members] == [child]  # the orphan, not the process in another session
        assert session_members(leader.pid, born, str(tmp_path / "other.json")) == []  # not marked, not vLLM: left alone
        assert end_processes(members, timeout_s=5) == [] and not psutil.pid_exists(child)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_port_holder_finds_the_listening_process():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert port_holder(sock.getsockname()[1]) == (True, os.getpid())
    assert port_holder(_free_port())[0] is False


# ---------------------------------------------------------------- against the real engine

@pytest.fixture(scope="module")
def env(tmp_path_factory):
    # An engine of its own, not the suite's shared one: these tests start it from two processes at once, with an API
    # key, lose its state file and kill it with SIGKILL.
    with engine_environment(PORT, tmp_path_factory.mktemp("owned-engine")) as state:
        try:
            yield state
        finally:
            LocalEngine(load_settings()).stop()


@pytest.fixture
def keyed(env, monkeypatch):
    """The engine of these tests is started with an API key (set per test: conftest clears the contract)."""
    monkeypatch.setenv("VLLM_API_KEY", "owner-key")
    return env


STARTER = ("from helpers.engine.local import LocalEngine; from helpers.core.settings import load_settings; "
           "e = LocalEngine(load_settings()); e.start(); print('PID', e.pid, flush=True)")


@pytest.mark.engine
def test_two_processes_starting_at_once_get_one_engine(keyed):
    starters = [subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in starters]
    pids = {line.split()[1] for out in outputs for line in out.splitlines() if line.startswith("PID ")}
    assert len(pids) == 1, outputs
    assert any("waiting for " in out for out in outputs), outputs  # the second one waited for the first
    busy, holder = port_holder(PORT)
    assert busy and str(holder) == pids.pop()


@pytest.mark.engine
def test_a_wrong_api_key_fails_at_once_with_the_401_message(keyed, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "not-the-key")
    started = time.monotonic()
    with pytest.raises(EngineError, match="refused the API key \\(HTTP 401\\): set VLLM_API_KEY"):
        connect(load_settings())
    assert time.monotonic() - started < 30  # not the 300 s start timeout


@pytest.mark.engine
@pytest.mark.parametrize("damage", ["delete", "truncate", "garbage"])
def test_a_lost_state_file_adopts_the_engine_and_restart_replaces_it(keyed, damage):
    engine = LocalEngine(load_settings())
    engine.start()
    old = engine.pid
    path = Path(keyed) / f"engine-{PORT}.json"
    {"delete": path.unlink, "truncate": lambda: path.write_text(""),
     "garbage": lambda: path.write_text('{"pid": "abc"}')}[damage]()
    fresh = LocalEngine(load_settings())
    status = fresh.status()
    assert status["pid"] == old and status["ready"] is True and f"our engine (pid {old})" in status["port"]
    assert f"adopted the engine serving on port {PORT} (pid {old})" in status["state_file"]
    if damage == "delete":  # restart stops the adopted server instead of colliding with it
        fresh.restart()
        assert fresh.pid not in (None, old) and not psutil.pid_exists(old)
        assert fresh.status()["ready"] is True


@pytest.mark.engine
def test_kill_9_of_the_server_leaves_no_engine_core(keyed):
    engine = LocalEngine(load_settings())
    settings = load_settings()
    base = default_config(settings)
    # a separate engine-core process, as on the GPU profile
    engine.apply(replace(base, env=(("VLLM_ENABLE_V1_MULTIPROCESSING", "1"),)))
    server = psutil.Process(engine.pid)
    born = server.create_time()
    core = [p for p in session_members(server.pid, born, str(engine._state_path)) if p.pid != server.pid]
    assert core, "expected an engine-core process beside the server"
    os.kill(server.pid, signal.SIGKILL)
    psutil.wait_procs([server], timeout=10)
    assert any(p.is_running() for p in core)  # what the issue saw: the core outlives its server
    engine.start(base)  # finds the leftovers of the killed engine, ends them, starts afresh
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in core)
    assert engine.status()["ready"] is True


def test_the_start_phase_follows_the_servers_log():
    log = ["=== starting 2026-11-30 20:12:06: tiny-agent --enforce-eager",
           "(APIServer pid=1) INFO [api_utils.py:286] non-default args: {'enable_auto_tool_choice': True}",
           "(EngineCore pid=2) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='m'",
           "(EngineCore pid=2) INFO [cpu_model_runner.py:68] Starting to load model m...",
           "(EngineCore pid=2) INFO [default_loader.py:501] Loading weights took 0.02 seconds",
           "(EngineCore pid=2) INFO [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens",
           "(EngineCore pid=2) INFO [core.py:402] init engine (profile, create kv cache, warmup model) took 1.70 s",
           "(APIServer pid=1) INFO [entry.py:140] Starting vLLM server on http://127.0.0.1:8765"]
    phases = [start_phase("\n".join(log[:n])) for n in range(1, len(log) + 1)]
    assert phases == ["starting Python and importing vLLM", "reading its arguments", "starting the engine core",
                      "loading the weights", "allocating the KV cache", "profiling and warming up",
                      "starting the HTTP server", "generating a first token"]


def test_workshop_status_and_down_report_a_damaged_state_file(capsys, monkeypatch):
    from helpers.cli.main import main

    port = _free_port()
    monkeypatch.setenv("WORKSHOP_PORT", str(port))
    (state_dir() / f"engine-{port}.json").write_text('{"pid": "abc"}')
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"engine-{port}.json: pid 'abc' is not a process ID" in out and f"{port}: free (no engine running)" in out
    assert main(["down"]) == 0
    assert capsys.readouterr().out.splitlines() == ["no local engine was running",
                                                    "note: state file: pid 'abc' is not a process ID"]
