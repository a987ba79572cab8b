"""Shared fixtures: an isolated state directory, and the real local engine for integration tests; the suite's time
table (tests/timetable.py: build/test-times.md on every run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.core.settings import CONTRACT_VARIABLES
from timetable import TimeTable

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimeTable(config), "timetable")


@pytest.fixture(autouse=True)
def isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests never touch the user's engine state or environment contract."""
    for name in CONTRACT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if "WORKSHOP_STATE_DIR" not in os.environ:
        monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path_factory.mktemp("state")))
