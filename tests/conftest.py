"""Shared fixtures: an isolated state directory, and one real local engine of the default configuration that the
engine tests which only read from it share (``shared_engine``); the suite's time table (tests/timetable.py:
build/test-times.md on every run)."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fakes import engine_environment
from helpers.core.lesson import CI_PREDICTION_ENV
from helpers.core.settings import CONTRACT_VARIABLES, load_settings
from timetable import TimeTable

REPO = Path(__file__).resolve().parent.parent
TEST_PORT = os.environ.get("WORKSHOP_TEST_PORT", "8765")  # another port lets two suites run side by side


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimeTable(config), "timetable")


@pytest.fixture(autouse=True)
def isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests never touch the user's engine state or environment contract."""
    for name in CONTRACT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if "WORKSHOP_STATE_DIR" not in os.environ:
        monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    # The test run makes every exercise's prediction (the first choice), so each notebook shows its outcome.
    monkeypatch.setenv(CI_PREDICTION_ENV, os.environ.get(CI_PREDICTION_ENV) or "first")


class SharedEngine:
    """The suite's real local engine on TEST_PORT with its own state directory, started by the first test that uses
    it and kept for the next one that does. ``use()`` puts it back on the default configuration when a test before
    changed its flags or model (``LocalEngine.start``: no restart when it already serves that configuration). A test
    that changes flags or the model for itself starts an engine of its own instead, and says so."""

    def __init__(self, state_dir: Path, port: str = TEST_PORT) -> None:
        self.state_dir, self.port = state_dir, port
        self.lab = None  # the Lab while the engine runs

    @contextmanager
    def use(self) -> Iterator:
        """The Lab, with this process's environment on the engine's port and state directory while it is used."""
        from helpers.engine.interface import default_config
        from helpers.engine.session import connect

        with engine_environment(self.port, self.state_dir):
            if self.lab is None:
                self.lab = connect(load_settings())
            else:
                self.lab.engine.start(default_config(self.lab.settings))
            yield self.lab

    def stop(self) -> None:
        if self.lab is not None:
            with engine_environment(self.port, self.state_dir):
                self.lab.engine.stop()
            self.lab = None


_SHARED: list[SharedEngine] = []  # the session's one SharedEngine, once a test asked for it


@pytest.fixture(scope="session")
def shared_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedEngine]:
    """One real engine of the default configuration for every test that only reads from it (stopped at the end)."""
    shared = SharedEngine(tmp_path_factory.mktemp("shared-engine-state"))
    _SHARED.append(shared)
    try:
        yield shared
    finally:
        shared.stop()
        _SHARED.remove(shared)


# A file that uses the shared engine but first waits for what the tests without an engine make beside the engine run
# (``make test`` runs both at once): the client install of tests/test_client_env.py. Last of the shared engine's files,
# so that the install is done by the time it comes.
SHARED_LATE = ("tests/test_client_env.py",)


def shared_files_first(items: list) -> list:
    """The items with the files that use the shared engine first (whole files, each in its order; SHARED_LATE last of
    them), so that one start serves them all; the other files after them, as collected. Scheduling only: no test
    depends on another's order."""
    users = {item.nodeid.split("::", 1)[0] for item in items if "shared_engine" in getattr(item, "fixturenames", ())}

    def place(item) -> tuple[bool, bool]:
        file = item.nodeid.split("::", 1)[0]
        return file not in users, file in SHARED_LATE

    return sorted(items, key=place)


def pytest_collection_modifyitems(items: list) -> None:
    items[:] = shared_files_first(items)


# Two test runs on one machine with engine tests on the same port take turns: the second waits for the first to end
# (one vLLM engine on a 2-core machine at a time, and one owner of TEST_PORT). Another WORKSHOP_TEST_PORT runs beside.
ENGINE_TESTS_LOCK = Path(tempfile.gettempdir()) / f"workshop-engine-tests-{TEST_PORT}.lock"
_LOCK: list = []


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") or not any(i.get_closest_marker("engine") for i in session.items):
        return
    handle = open(ENGINE_TESTS_LOCK, "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"\nwaiting for another test run's engine tests on port {TEST_PORT} to end ({ENGINE_TESTS_LOCK})",
              flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
    _LOCK.append(handle)  # held until this process ends


@pytest.hookimpl(trylast=True)  # after the fixtures' teardown
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared engine when the next test does not use it: it never runs beside a test's own engine (their
    ports and the machine's two cores are shared); a later test that uses it starts it again."""
    if _SHARED and "shared_engine" not in getattr(nextitem, "fixturenames", ()):
        _SHARED[0].stop()
