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
    # the two mechanisms written out before the helpers take over: the streaming timer and the bare agent loop
    assert re.search(r"\d+ chunks with text: TTFT [\d.]+ ms, TPOT [\d.]+ ms", text)
    assert re.search(r"tool results sent back: \['\{.*\}'\]\nanswer: ", text)
    assert "tool call parsed by vLLM: {'name': 'get_weather', 'arguments': {'city': 'Paris'}}" in text
    # the code exercise: the learner's None asks (no hint yet), the worked solution passes its check in its own name
    assert "Your turn (TPOT from the chunks): replace the None" in text
    assert re.search(r"The worked solution \(TPOT from the chunks\): [\d.]+ ms per token", text)
    assert "✔ TPOT from the chunks: right" not in text  # "Run All" marks nothing right for the learner
    # the thinking model: tiny-qwen3 started beside the baseline, its reasoning beside its tool call, stopped after
    assert "serving tiny-qwen3, the thinking stand-in, with --reasoning-parser qwen3 on port" in text
    assert re.search(r"reasoning \(\d+ tokens\): '.+'", text)
    assert re.search(r"What you should see: the model thinks first.*\n  ✔ seen in this run: tiny-qwen3 thought first "
                     r"\(\d+ words, \d+ reasoning tokens of \d+\), then called get_weather\(", text)
    assert lab.engine.config().served_name == "tiny-agent" and "--reasoning-parser" not in lab.engine.args()
    assert text.count("(made by the test run)") == 2  # the two predictions, on the core path
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
    # one request's life: the server's phases from its own histograms, set against the client's chunks
    assert re.search(r"What you should see: the first chunk arrives just after the server's prefill ends\n  [✔✘] .*: the "
                     r"server spent [\d,.]+ ms queued and in prefill of the client's [\d,.]+ ms TTFT; the first chunk "
                     r"arrived -?[\d,.]+ ms after the prefill ended", text), text[-3000:]
    # Go deeper: one agent run traced down to vLLM's spans, read back from a local Phoenix (CI installs it)
    assert "The viewer ran at http://127.0.0.1:" in text or "Not run: Arize Phoenix (the trace store) is not installed" in text
