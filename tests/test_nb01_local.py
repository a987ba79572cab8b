"""Notebook 01 on the local path: run top to bottom against the shared real engine (tests/notebook_local.py)."""

from __future__ import annotations

import re

import nbformat
import pytest

from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine


def test_notebook_01_runs_top_to_bottom(lab, tmp_path):
    run = run_local("01_connect_and_first_agent.ipynb", tmp_path,
                    parameters={"STREAM_MAX_TOKENS": 32})
    text = printed(run)
    assert "tool call parsed by vLLM: {'name': 'get_weather', 'arguments': {'city': 'Paris'}}" in text
    assert "What we learned" in "".join(c.source for c in nbformat.read(run.output, as_version=4).cells)
    assert re.search(r"the prompt went from \d[\d,]* to \d[\d,]* tokens", text)
    # the stream's pace is judged from the gaps as they arrived, whichever way it went
    assert re.search(r"\[(shown|not shown)\] after the first token, tokens arrive at a steady pace "
                     r"\(one decode step each\): "
                     r"(the gaps between chunks had a median|one gap of)", text)
    assert "per million output tokens, prompts included" in text  # the same unit on both sides
    assert "A CPU's tokens/s says nothing of a GPU's" in text
    # every price from the dated table, with its source; cached input and the break-even from this run's numbers
    assert re.search(r"API gpt-4\.1-mini: 0\.4 in, 0\.1 cached, 1\.6 out USD per 1M tokens \(OpenAI API pricing", text)
    assert "engine: 0.067 USD/h (Google Cloud Compute Engine VM pricing" in text
    assert "- Cached input: " in text and re.search(r"- Break-even: .* busy [\d,]+% of the day", text)
