"""start_here on the local path: run top to bottom against the shared real engine (tests/notebook_local.py)."""

from __future__ import annotations

import pytest

from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine


def test_start_here_shows_the_running_engine_without_restarting_it(lab, tmp_path):
    pid = lab.engine.pid
    run = run_local("start_here.ipynb", tmp_path)
    assert f"The engine is ready: {lab.settings.base_url} serves {lab.model!r}" in printed(run)
    assert lab.engine.pid == pid
