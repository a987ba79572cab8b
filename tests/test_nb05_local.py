"""Notebook 05 on the local path: run top to bottom against the shared real engine (tests/notebook_local.py)."""

from __future__ import annotations

import re

import pytest

from helpers.core.vllm_args import flag_value
from helpers.hardware.machine import capability
from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine


def test_notebook_05_quantized_variants_with_eval_and_load(lab, tmp_path):
    run = run_local("05_quantization.ipynb", tmp_path,
                    parameters={"VARIANTS": ["tiny-agent-w8a8"], "CONCURRENCIES": [1, 4], "NUM_REQUESTS": 8})
    text = printed(run)
    assert "could not serve it" not in text and "refused it here" not in text
    fp8_kv = capability("fp8_kv_cache").ok  # AVX-512 or AMX (tests/test_forced_cpu_kind.py covers AVX2)
    for config in ("bf16 (baseline)", "w8a8"):
        assert re.search(rf"- {re.escape(config)}: .* eval \d+\.\d% \(95% CI", text), config
    if fp8_kv:  # the capacity is read at start-up, so it shows even when the FP8 KV step is too slow to measure
        assert re.search(r"- kv-cache fp8: (.* eval \d+\.\d% \(95% CI|skipped\. Served, but)", text)
        kv = re.search(r"an FP8 KV cache holds twice the tokens\n  ✔ seen in this run: ([\d,]+) -> ([\d,]+) KV tokens \(2\.00x", text)
        assert kv and int(kv[2].replace(",", "")) == 2 * int(kv[1].replace(",", "")), text[-4000:]
    else:
        assert "- kv-cache fp8: skipped. This step needs x86 with AVX-512 or AMX" in text
    # Online FP8 weights are measured, or, where vLLM has no fast FP8 kernel for this CPU (about 1 token/s on
    # an AMX machine through torch's generic FP8 path), probed and reported as too slow to measure
    assert re.search(r"- online fp8_per_channel: (.* eval \d+\.\d% \(95% CI|skipped\. Served, but it decodes "
                     r"[\d.]+ tokens/s against the baseline's \d+ \(\d+x slower\))", text)
    # the lesson's scaffolding ran on this run's numbers: six checks, the map, three exercises (no prediction in CI)
    assert re.search(r"What you should see: every quantized checkpoint is smaller on disk than BF16\n  ✔", text)
    assert text.count("What you should see:") == 6 and text.count("(made by the test run)") == 3
    assert re.search(r"Map: \d+ schemes; this run measured [1-9]\d* of them", text)
    # a configuration too slow to measure is "not measured", never a disagreement with the probe
    assert "not measured (too slow here) although" not in text
    assert "Published, not from this run" in text and re.search(r"Roofline \(computed, not measured\)", text)
    assert lab.model == "tiny-agent" and flag_value(lab.engine.args(), "--kv-cache-dtype") is None
