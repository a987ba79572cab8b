"""Notebook 02 on the local path: run top to bottom against the shared real engine (tests/notebook_local.py)."""

from __future__ import annotations

import re

import pytest

from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine


def test_notebook_02_compares_prediction_with_the_engine(lab, tmp_path):
    run = run_local("02_units_and_memory_budget.ipynb", tmp_path)
    text = printed(run)
    assert "(exact)" in text and "[shown] the planner predicts the CPU engine's KV capacity" in text
    assert "blocks of 128 tokens: 16 is vLLM's default on a GPU" in text
    assert re.search(r"the driver reports [\d.]+ GiB", text)
    # section 2: parameters and KV bytes per token by hand from config.json, confirmed by the planner; the KV bytes
    # are the code exercise: the learner's None asks (no hint yet), the worked solution passes its check in its own name
    assert "Your turn (KV bytes per token): replace the None" in text and "✔ KV bytes per token: right" not in text
    assert "The worked solution (KV bytes per token): by hand, 147,456 bytes of KV cache per token" in text
    assert text.count("(made by the test run)") == 2  # the two predictions, on the core path
    assert re.search(r"What you should see: the planner confirms the hand count.*\n  ✔ seen in this run: Qwen3-4B: by hand", text)
