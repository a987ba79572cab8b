"""The suite's shared engine (tests/conftest.py ``SharedEngine``), against tests/fake_engine_server.py: started once,
back on the default configuration when a test changed it, stopped when the next test does not use it."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import conftest
import timetable
from fake_engine_server import use_fake_engine
from helpers.core.vllm_args import flag_value
from helpers.engine.local import START_RECORD_VARIABLE
from helpers.engine.process import port_holder


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def test_the_shared_engine_starts_once_and_is_put_back_on_the_default_configuration(tmp_path, monkeypatch):
    use_fake_engine(monkeypatch)
    record = tmp_path / "starts.jsonl"
    monkeypatch.setenv(START_RECORD_VARIABLE, str(record))
    port = _free_port()
    shared = conftest.SharedEngine(tmp_path / "state", port)
    try:
        with shared.use() as lab:
            assert os.environ["WORKSHOP_PORT"] == port and lab.check() == ["tiny-agent"]
            default_args = lab.engine.args()
            pid = lab.engine.pid
        assert os.environ.get("WORKSHOP_PORT") != port  # the environment is back once the test is done with it
        with shared.use() as lab:
            assert lab.engine.pid == pid  # the same engine: no second start
            lab.engine.set_flag("--max-num-seqs", "3")  # a test changes it
            assert flag_value(lab.engine.args(), "--max-num-seqs") == "3"
        with shared.use() as lab:
            assert lab.engine.args() == default_args and lab.engine.pid != pid  # the next finds the default again
        assert len(timetable.read_starts(record)) == 3  # the first start, the flag, the way back
    finally:
        shared.stop()
    assert shared.lab is None and not port_holder(int(port))[0]


def test_the_shared_engine_is_stopped_when_the_next_test_does_not_use_it(monkeypatch):
    stopped = []
    shared = SimpleNamespace(stop=lambda: stopped.append(True))
    monkeypatch.setattr(conftest, "_SHARED", [shared])
    user, other = SimpleNamespace(fixturenames=["shared_engine", "tmp_path"]), SimpleNamespace(fixturenames=["tmp_path"])
    conftest.pytest_runtest_teardown(user, user)
    assert stopped == []
    conftest.pytest_runtest_teardown(user, other)
    conftest.pytest_runtest_teardown(user, None)  # the last test of the session
    assert stopped == [True, True]


def test_the_files_that_use_the_shared_engine_run_first_whole_and_in_their_order():
    def item(nodeid, *fixtures):
        return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures))

    items = [item("tests/test_a.py::one"), item("tests/test_b.py::own_engine"), item("tests/test_b.py::reads", "shared_engine"),
             item("tests/test_c.py::x"), item("tests/test_d.py::reads", "shared_engine")]
    order = [i.nodeid for i in conftest.shared_files_first(items)]
    assert order == ["tests/test_b.py::own_engine", "tests/test_b.py::reads", "tests/test_d.py::reads",
                     "tests/test_a.py::one", "tests/test_c.py::x"]  # a file is never split: its module fixtures once
    late = [item("tests/test_client_env.py::installs"), item("tests/test_client_env.py::reads", "shared_engine"), *items]
    order = [i.nodeid for i in conftest.shared_files_first(late)]
    assert order[:4] == ["tests/test_b.py::own_engine", "tests/test_b.py::reads", "tests/test_d.py::reads",
                         "tests/test_client_env.py::installs"]  # the client install's file last of the engine's users

