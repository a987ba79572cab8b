"""Notebook 05 on the local path: run top to bottom against the shared real engine (tests/notebook_local.py)."""

from __future__ import annotations

import re

import pytest

from helpers.core.vllm_args import flag_value
from helpers.hardware.machine import capability
from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine
# The smallest run that still takes every branch: one checkpoint (its eval compared with the baseline's), two
# concurrencies, the FP8 KV cache, and on the CPU the Go deeper online step (RUN_GO_DEEPER is on there).
PARAMETERS = {"VARIANTS": ["tiny-agent-w8a8"], "CONCURRENCIES": [1, 4], "NUM_REQUESTS": 8}


def test_notebook_05_quantized_variants_with_eval_and_load(lab, tmp_path):
    run = run_local("05_quantization.ipynb", tmp_path, parameters=PARAMETERS)
    text = printed(run)
    assert "could not serve it" not in text and "refused it here" not in text
    # section 2 by hand: one matrix to FP8 and INT8, the code exercise asking, its solution set beside the checkpoint
    assert re.search(r"fp8 e4m3, per channel: relative error \d+\.\d+%, largest absolute error", text)
    assert re.search(r"What you should see: 8 bits keep the matrix within a few percent in both formats\n  ✔", text)
    assert "Your turn (W in INT4): replace the None" in text
    assert "The worked solution (W in INT4): 101,376 bytes against 393,216 in BF16 (3.88x smaller)" in text
    assert "✔ W in INT4" not in text  # the solution marks nothing right for the learner
    fp8_kv = capability("fp8_kv_cache").ok  # AVX-512 or AMX (tests/test_forced_cpu_kind.py covers AVX2)
    for config in ("bf16 (baseline)", "w8a8"):
        assert re.search(rf"- {re.escape(config)}: .* eval \d+\.\d% \(95% CI", text), config
    if fp8_kv:  # the capacity is read at start-up, so it shows even when the FP8 KV step is too slow to measure
        assert re.search(r"- kv-cache fp8: (.* eval \d+\.\d% \(95% CI|skipped\. Served, but)", text)
        kv = re.search(r"an FP8 KV cache holds twice the tokens\n  ✔ seen in this run: ([\d,]+) -> ([\d,]+) KV tokens \(2\.00x", text)
        assert kv and int(kv[2].replace(",", "")) == 2 * int(kv[1].replace(",", "")), text[-4000:]
    else:
        assert "- kv-cache fp8: skipped. This step needs x86 with AVX-512 or AMX" in text
    assert re.search(r"Weights served: tiny-agent 8\.3 MB[;.]", text)  # from its files, beside this CPU's cache
    # Online FP8 weights (Go deeper) are measured, or, where vLLM has no fast FP8 kernel for this CPU (about 1 token/s
    # on an AMX machine through torch's generic FP8 path), probed and reported as too slow to measure
    assert re.search(r"- online fp8_per_channel: (.* eval \d+\.\d% \(95% CI|skipped\. Served, but it decodes "
                     r"[\d.]+ tokens/s against the baseline's \d+ \(\d+x slower\))", text)
    # the lesson's scaffolding ran on this run's numbers: seven checks, the map, three exercises (no prediction in CI)
    assert re.search(r"What you should see: every quantized checkpoint is smaller on disk than BF16\n  ✔", text)
    assert text.count("What you should see:") == 7 and text.count("(made by the test run)") == 3
    assert re.search(r"Map: \d+ schemes; this run measured [1-9]\d* of them", text)
    # a configuration too slow to measure is "not measured", never a disagreement with the probe
    assert "not measured (too slow here) although" not in text
    assert "Published, not from this run" in text and re.search(r"Roofline \(computed, not measured\)", text)
    assert lab.model == "tiny-agent" and flag_value(lab.engine.args(), "--kv-cache-dtype") is None
    assert flag_value(lab.engine.args(), "--quantization") is None
