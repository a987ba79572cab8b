"""Notebook 04 on the local path: run top to bottom against the shared real engine (tests/notebook_local.py)."""

from __future__ import annotations

import re

import pytest

from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine


def test_notebook_04_serves_the_tiny_dense_and_moe_models(lab, tmp_path):
    run = run_local("04_dense_vs_moe.ipynb", tmp_path,
                    parameters={"BATCHES": [1, 4], "OUTPUT_LEN": 64, "REQUESTS_PER_STREAM": 1, "REPEATS": 2})
    text = printed(run)
    assert text.count("(made by the test run)") == 3  # every exercise ran and checked its outcome
    assert "This run: stays about the same." in text  # the MoE/dense ceiling ratio is a ratio of bytes
    assert re.search(r"What you should see: Qwen3-4B's batch-1 decode is memory-bound on RTX 4000 Ada\n  ✔", text)
    for batch in (1, 4):  # every batch judged against the repeats' spread, whichever way it went
        assert re.search(rf"\[(shown|not shown|within noise)\] the tiny MoE decodes no faster than the dense model: "
                         rf"batch {batch}: tiny-moe [\d,]+ tok/s vs tiny-agent [\d,]+ tok/s \([\d.]+x \(noise", text)
    assert "On a GPU (computed from the published configs and the datasheet, not measured here)" in text
    assert re.search(r"Qwen3-30B-A3B: 30\.5 B parameters in total but 3\.[34] B active", text)
    # the decode ceiling by hand (GPU, then this machine), and the GPU figures beside the CPU ones
    assert re.search(r"What you should see: the hand division gives the table's ceiling\n  ✔", text)
    assert re.search(r"tiny-agent on this machine: [\d.]+ GB/s / [\d.]+ MB = [\d,]+ decode steps/s at most", text)
    assert re.search(r"- This run \(measured here, CPU\): at batch 4 tiny-moe decodes [\d,]+ tok/s", text)
    assert "- Roofline on RTX 4000 Ada (computed, not measured" in text
    assert "- Published, not from this run: DeepSeek-V2" in text
    assert lab.model == "tiny-agent"
