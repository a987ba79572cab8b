"""Shared fixtures: an isolated state directory, and the real local engine for integration tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.core.settings import CONTRACT_VARIABLES

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests never touch the user's engine state or environment contract."""
    for name in CONTRACT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    if "WORKSHOP_STATE_DIR" not in os.environ:
        monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path_factory.mktemp("state")))
