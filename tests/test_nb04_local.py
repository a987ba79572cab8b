"""Notebook 04 on the local path: run top to bottom against the shared real engine (tests/notebook_local.py)."""

from __future__ import annotations

import re

import pytest

from helpers.core.vllm_args import flag_value
from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine
# The smallest run that still takes every branch: two batches (a comparison per batch against the repeats' spread),
# two repeats (a measured spread), and for thinking two questions in one round (tiny-qwen3, on its own engine beside the baseline).
PARAMETERS = {"BATCHES": [1, 4], "OUTPUT_LEN": 64, "REQUESTS_PER_STREAM": 1, "REPEATS": 2,
              "THINKING_QUESTIONS": ["What's the weather in Paris?", "What is 17 times 23?"], "THINKING_ROUNDS": 1}


def test_notebook_04_serves_the_tiny_dense_and_moe_models_and_measures_thinking(lab, tmp_path):
    run = run_local("04_dense_vs_moe.ipynb", tmp_path, parameters=PARAMETERS)
    text = printed(run)
    assert text.count("(made by the test run)") == 3  # every exercise ran and checked its outcome
    assert "This run: stays about the same." in text  # the MoE/dense ceiling ratio is a ratio of bytes
    # the code exercise asks for its answer, and the collapsed solution passes its check
    assert "Your turn (the MoE's decode ceiling): replace the None" in text
    assert re.search(r"The worked solution \(the MoE's decode ceiling\): [\d,]+ tokens/s: [\d.]+x the dense model's "
                     r"ceiling", text)
    assert "✔ the MoE's decode ceiling" not in text  # the solution marks nothing right for the learner
    assert re.search(r"Qwen3-30B-A3B: [\d.]+ GB of BF16 weights exceed the RTX 4000 Ada's", text)  # computed, not typed
    assert re.search(r"What you should see: Qwen3-4B's batch-1 decode is memory-bound on RTX 4000 Ada\n  ✔", text)
    for batch in (1, 4):  # every batch judged against the repeats' spread, whichever way it went
        assert re.search(rf"\[(shown|not shown|within noise)\] the tiny MoE decodes no faster than the dense model: "
                         rf"batch {batch}: tiny-moe [\d,]+ tok/s vs tiny-agent [\d,]+ tok/s \([\d.]+x \(noise", text)
    # the tiny models' weights from their files, beside this CPU's cache (or that it is not readable)
    assert re.search(r"Weights served: tiny-agent 8\.3 MB, tiny-moe 22\.5 MB[;.]", text)
    assert "On a GPU (computed from the published configs and the datasheet, not measured here)" in text
    assert re.search(r"Qwen3-30B-A3B: 30\.5 B parameters in total but 3\.[34] B active", text)
    assert re.search(r"What you should see: the hand division gives the table's ceiling\n  ✔", text)
    assert re.search(r"tiny-agent on this machine: [\d.]+ GB/s / [\d.]+ MB = [\d,]+ decode steps/s at most", text)
    assert re.search(r"- This run \(measured here, CPU\): at batch 4 tiny-moe decodes [\d,]+ tok/s", text)
    assert "- Roofline on RTX 4000 Ada (computed, not measured" in text
    assert "- Published, not from this run: DeepSeek-V2" in text
    # thinking, measured: tiny-qwen3 served with the reasoning parser, a reasoning beside its answer, the verdict
    assert "serving tiny-qwen3, the thinking stand-in, with --reasoning-parser qwen3 on port" in text
    assert re.search(r"\"What's the weather in Paris\?\", thinking on: reasoning \(\d+ tokens\) [\"'].+[\"'], then \(\d+ "
                     r"tokens\)", text)  # the question's repr: in double quotes, for its apostrophe
    thought = re.search(r"What you should see: thinking costs output tokens and decode time.*\n  [✔✘~] .*: tiny-qwen3, "
                        r"2 questions x 1 round: thinking on wrote (\d+) reasoning \+ \d+ answer tokens per answer", text)
    assert thought and int(thought.group(1)) > 0, text[-4000:]
    assert "Priced from the dated table, per 1,000 answers: at gpt-4.1-mini's output price" in text
    assert re.search(r"- \[(shown|not shown|within noise)\] thinking costs output tokens", text)  # in the summary
    assert "ms per output token with thinking on" in text  # exercise 2 read the run
    assert lab.model == "tiny-agent" and flag_value(lab.engine.args(), "--reasoning-parser") is None
