"""Notebook 05's judgement, fed numbers that go both ways."""

from __future__ import annotations

import re

from helpers.lessons.l05_quantization import chosen_kernels, conclusions, skip_reason, too_slow_reason
from helpers.core.settings import models_dir

SPEED = "c8_output_tok_s"


def row(config, speed, kv=524288, size=9.0, pass_rate=0.8):
    return {"config": config, SPEED: speed, "kv_capacity_tokens": kv, "size_on_disk_mb": size,
            "all_pass_rate": pass_rate, "all_ci_low": pass_rate - 0.1, "all_ci_high": min(1.0, pass_rate + 0.1)}


def test_a_variant_within_the_baselines_spread_is_no_faster_and_the_cpu_reason_is_given():
    lines = conclusions([row("bf16", 1000), row("w8a8", 1040, size=5.0)], [1000, 950], SPEED, {}, {}, "cpu")
    text = "\n".join(lines)
    assert "- w8a8: 5.0 MB on disk (0.56x)" in text and "no measurable difference" in text
    assert "- [within noise] fewer bits per weight decode faster: No configuration was measurably faster" in text
    assert "fixed per-step costs" in text
    assert "--kv-cache-memory-bytes" in text


def test_a_variant_beyond_the_spread_is_called_faster_and_a_regression_is_named():
    lines = conclusions([row("bf16", 1000), row("w8a8", 1400, pass_rate=0.5)], [1000, 990], SPEED,
                        {"w8a8": ["tool_call"]}, {}, "gpu")
    text = "\n".join(lines)
    assert "- [shown] fewer bits per weight decode faster: Faster than the baseline beyond its noise: w8a8." in text
    assert "regressed in tool_call" in text
    assert "No configuration was measurably faster" not in text and "--kv-cache-memory-bytes" not in text


def test_slower_variants_are_named_and_kv_growth_is_reported_as_measured():
    lines = conclusions([row("bf16", 1000), row("kv-cache fp8", 600, kv=1048576)], [1000, 1010], SPEED, {}, {}, "cpu")
    text = "\n".join(lines)
    assert "- [not shown] fewer bits per weight decode faster: No configuration" in text
    assert "(kv-cache fp8 slower)" in text and ": worse;" in text
    assert "kv-cache fp8 holds 2.00x the baseline's KV tokens" in text


def test_skipped_configurations_say_why():
    text = "\n".join(conclusions([row("bf16", 1000)], [1000], SPEED, {}, {"w4a16": "This step needs AVX-512."}, "cpu"))
    assert "- w4a16: skipped. This step needs AVX-512." in text


def test_skip_reason_follows_the_cpu_kind(monkeypatch):
    w4 = models_dir() / "tiny-agent-w4a16"
    monkeypatch.setenv("WORKSHOP_CPU_ISA", "avx2")
    assert "AVX-512" in skip_reason("cpu", w4) and "AVX-512 or AMX" in skip_reason("cpu", kv_cache_dtype="fp8")
    assert skip_reason("cpu", models_dir() / "tiny-agent-w8a8") is None
    assert skip_reason("k8s", w4) is None  # the engine is elsewhere
    monkeypatch.setenv("WORKSHOP_CPU_ISA", "avx512")
    assert skip_reason("cpu", w4) is None and skip_reason("cpu", kv_cache_dtype="fp8") is None


def test_a_configuration_too_slow_to_measure_is_skipped_with_its_rate_and_kernel():
    slow = too_slow_reason(1.0, 100.0, baseline_measure_s=60, max_measure_s=600,
                           kernels=["ChannelWiseTorchFP8ScaledMMLinearKernel"])
    assert slow.startswith("Served, but it decodes 1.0 tokens/s against the baseline's 100 (100x slower)")
    assert "ChannelWiseTorchFP8ScaledMMLinearKernel" in slow and "about 100 min" in slow
    assert too_slow_reason(50.0, 100.0, baseline_measure_s=60, max_measure_s=600) is None  # 2 min: measured


def test_chosen_kernels_come_from_the_engine_log_once_each():
    log = ("(EngineCore) INFO [__init__.py:797] Selected ChannelWiseTorchFP8ScaledMMLinearKernel for Fp8PtpcOnline\n"
           "(EngineCore) INFO Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8\n"
           "(EngineCore) INFO Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8\n")
    assert chosen_kernels(log) == ["ChannelWiseTorchFP8ScaledMMLinearKernel", "CPUInt8ScaledMMLinearKernel"]
    assert chosen_kernels("no such line") == []



def test_the_core_paths_conclusions_leave_go_deepers_configurations_to_go_deeper(monkeypatch):
    """The last cell reports what the core path measured; Go deeper's online step is reported at Go deeper's end."""
    from types import SimpleNamespace

    import pandas as pd

    from helpers.lessons import l05_quantization as l05

    study = object.__new__(l05.QuantizationStudy)
    study.lab = SimpleNamespace(engine=SimpleNamespace(config=lambda: "baseline flags"))
    study.baseline_config, study.part, study.parts = "baseline flags", l05.CORE, {}
    study.baseline_runs, study.speed, study.profile = [1000, 990], SPEED, "gpu"
    study.comparisons, study.startup, study.skipped = {}, {}, {}
    assert study.conclusions(l05.GO_DEEPER)[0].startswith("- go deeper: no configuration was measured")
    study.parts["w8a8"] = l05.CORE
    study.skip("w4a16", "This step needs AVX-512.")  # on the core path
    monkeypatch.setattr(l05, "skip_reason", lambda *a, **k: "vLLM has no kernel for it here.")
    study.measure_flags([("--quantization", "fp8_per_channel", "online fp8")], part=l05.GO_DEEPER)
    assert study.part == l05.CORE and study.parts["online fp8"] == l05.GO_DEEPER  # the next step is the core's again
    study.parts["online int8"] = l05.GO_DEEPER
    monkeypatch.setattr(study, "table", lambda: pd.DataFrame([row("bf16", 1000), row("w8a8", 1400),
                                                             row("online int8", 1500)]))
    core, deeper = "\n".join(study.conclusions()), "\n".join(study.conclusions(l05.GO_DEEPER))
    assert "- w8a8: " in core and "- w4a16: skipped" in core and "online" not in core
    assert deeper.startswith("- bf16: ") and "- online int8: " in deeper and "- online fp8: skipped" in deeper
    assert "w8a8" not in deeper and "w4a16" not in deeper


# ---------------------------------------------------------------- the checks and exercises of notebook 05

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE  # noqa: E402
from helpers.evals.suite import Comparison  # noqa: E402
from helpers.planning.shape import REFERENCE_CONFIGS  # noqa: E402
from helpers.lessons.l05_quantization import (eval_delta_outcome, fraction_outcome, growth_outcome, kv_check,  # noqa: E402
                                  planned_kv_tokens, size_check, speed_conclusion)


def test_size_check_goes_both_ways():
    assert size_check([row("bf16", 1, size=10.0), row("w8a8", 1, size=5.7)])[0] is True
    seen, detail = size_check([row("bf16", 1, size=10.0), row("odd", 1, size=11.0)])
    assert seen is False and "1.10x" in detail
    assert size_check([row("bf16", 1, size=10.0), {"config": "kv-cache fp8"}])[0] is None
    # a cluster engine's checkpoints are hub ids whose files this machine has not: a check this path cannot make
    seen, detail = size_check([{"config": "bf16 (baseline)"}, {"config": "RedHatAI/Qwen3-4B-FP8-dynamic"}])
    assert seen is None and "not on this machine" in detail and "no quantized checkpoint was measured" not in detail


def test_the_map_check_agrees_disagrees_or_has_no_probe_to_agree_with():
    import pandas as pd

    from helpers.lessons.l05_quantization import map_check

    def table(probe, run):
        return pd.DataFrame([{"scheme": "FP8", "this machine (probe)": probe, "this run": run}])

    assert map_check(table("yes (docs' matrix: x86 CPU)", "measured: fp8"), "cpu") == (True, "no row where they differ")
    seen, detail = map_check(table("no: this vLLM has no 'fp8' quantization method", "measured: fp8"), "cpu")
    assert seen is False and detail.startswith("FP8: measured: fp8 although the probe said 'no:")
    assert map_check(table("yes (probe: AVX-512)", "fp8 skipped"), "cpu")[0] is False
    # "not probed" is no "no": on the cluster the probe says nothing of the engine
    not_probed = table("not probed: the engine runs on the k8s profile (see the hardware column)", "measured: fp8")
    assert map_check(not_probed, "cpu")[0] is True
    seen, detail = map_check(not_probed, "k8s")
    assert seen is None and "says nothing of it" in detail


def _startup(tokens, dtype="auto", memory=2**30, block_size=128):
    return {"kv_capacity_tokens": tokens, "num_gpu_blocks": tokens // block_size, "block_size": block_size,
            "cache_dtype": dtype, "kv_cache_memory_bytes": memory}


def test_kv_check_reads_the_doubling_from_the_start_up_capacity_or_says_why_not():
    base = {"bf16 (baseline)": _startup(524288)}
    seen, detail = kv_check({**base, "kv-cache fp8": _startup(1048576, "fp8")}, "kv-cache fp8", {})
    assert seen is True and "524,288 -> 1,048,576 KV tokens (2.00x; 4,096 -> 8,192 blocks of 128 tokens)" in detail
    assert "1 GiB of KV memory, auto -> fp8" in detail
    assert kv_check({**base, "kv-cache fp8": _startup(524288, "fp8")}, "kv-cache fp8", {})[0] is False
    # a different KV memory is no comparison; a configuration never started says why
    assert kv_check({**base, "kv-cache fp8": _startup(2 * 1048576, "fp8", 2**31)}, "kv-cache fp8", {})[0] is None
    seen, detail = kv_check(base, "kv-cache fp8", {"kv-cache fp8": "This step needs AVX-512 or AMX"})
    assert seen is None and "AVX-512" in detail


def test_a_configuration_too_slow_to_measure_still_shows_its_start_up_capacity():
    slow = {"kv-cache fp8": "Served, but it decodes 11.0 tokens/s against the baseline's 90 (8x slower)."}
    lines = conclusions([row("bf16 (baseline)", 1000, kv=524288)], [1000, 990], SPEED, {}, slow, "cpu",
                        {"bf16 (baseline)": _startup(524288), "kv-cache fp8": _startup(1048576, "fp8")})
    text = "\n".join(lines)
    assert "- kv-cache fp8: skipped. Served, but" in text and "KV capacity of 1,048,576 tokens (2.00x)" in text
    assert "kv-cache fp8 holds 2.00x the baseline's KV tokens" in text
    # without a start-up reading the line stays the reason alone
    assert "start-up" not in "\n".join(conclusions([row("bf16 (baseline)", 1000)], [1000], SPEED, {}, slow, "cpu"))


def test_the_start_up_kv_tokens_are_read_from_a_gpu_or_cpu_engine_log():
    from pathlib import Path

    from helpers.lessons.l05_quantization import kv_tokens_from_log

    gpu_log = (Path(__file__).parent / "fixtures" / "kubectl_logs_vllm_ready.txt").read_text()
    assert kv_tokens_from_log(gpu_log) == 75792
    cpu = "[kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 4,096 tokens"
    assert kv_tokens_from_log("CPU KV cache size: 524,288 tokens\n" + cpu) == 1048576
    assert kv_tokens_from_log("no such line") is None


def test_fp8_beside_the_gpu_shows_the_cpu_number_the_roofline_and_the_published_figure():
    from helpers.lessons.l05_quantization import PUBLISHED_FP8, fp8_beside_gpu

    rows = [row("bf16 (baseline)", 1000), row("fp8-dynamic", 800), row("w8a8", 900)]
    lines = fp8_beside_gpu(rows, [1000, 1000], SPEED, {"online fp8_per_channel": "Served, but slow: details"},
                           REFERENCE_CONFIGS / "Qwen3-4B.json", "H100 SXM")
    text = "\n".join(lines)
    assert "fp8-dynamic 800 tok/s against the baseline's 1000 (0.80x)" in text and "w8a8" not in text
    assert "online fp8_per_channel not measured. Served, but slow." in text
    ceilings = re.search(r"at most at (\d+) tok/s in BF16 .* and (\d+) tok/s in FP8 .*: ([\d.]+)x", text)
    bf16, fp8, ratio = int(ceilings[1]), int(ceilings[2]), float(ceilings[3])
    assert fp8 > bf16 and 1.3 < ratio < 2.0  # fewer bytes read per step; the BF16 embeddings keep it under 2x
    assert "Published, not from this run" in text and PUBLISHED_FP8["source"] in text
    none = fp8_beside_gpu(rows[:1], [1000], SPEED, {}, REFERENCE_CONFIGS / "Qwen3-4B.json", "L4")
    assert none[0].startswith("- This run: no configuration with FP8 weights was served")


def test_speed_conclusion_verdicts():
    rows = [row("bf16", 1000), row("w8a8", 1500)]
    assert speed_conclusion(rows, [1000, 990], SPEED).verdict == SHOWN
    assert speed_conclusion([row("bf16", 1000), row("w8a8", 500)], [1000, 990], SPEED).verdict == NOT_SHOWN
    assert speed_conclusion([row("bf16", 1000), row("w8a8", 1010)], [1000, 950], SPEED).verdict == WITHIN_NOISE
    assert speed_conclusion([row("bf16", 1000)], [1000, 990], SPEED).verdict == WITHIN_NOISE


def _comparison(diff, p):
    table = pd.DataFrame([{"category": "all", "rate_a": 0.8, "rate_b": 0.8 + diff, "diff": diff, "p_value": p,
                           "pass_to_fail": 5 if diff < 0 else 0, "fail_to_pass": 5 if diff > 0 else 0,
                           "regression": diff < 0 and p < 0.05}]).set_index("category")
    return Comparison(table, pd.DataFrame(), True)


@pytest.mark.parametrize("diff, p, outcome", [(-0.3, 0.01, "lower"), (0.2, 0.01, "higher"), (-0.05, 0.5, "about the same"),
                                              (0.0, 1.0, "about the same")])
def test_the_eval_delta_counts_only_changes_beyond_noise(diff, p, outcome):
    assert eval_delta_outcome(_comparison(diff, p))[0] == outcome


def test_exercise_outcomes_cover_their_choices():
    assert [fraction_outcome(r) for r in (0.2, 0.4, 0.9)] == ["under 1/3", "1/3 to 2/3", "over 2/3"]
    assert [growth_outcome(r) for r in (1.05, 1.5, 2.5)] == ["about the same (under 1.1x)", "1.1x to 2x", "over 2x"]


def test_smaller_weights_leave_more_kv_tokens_on_a_gpu():
    config = REFERENCE_CONFIGS / "Qwen3-4B.json"
    assert planned_kv_tokens(config, "L4", "fp8") > planned_kv_tokens(config, "L4", "bf16")
    with pytest.raises(ValueError, match="leaves no KV memory"):
        planned_kv_tokens(REFERENCE_CONFIGS / "Llama-3.3-70B.json", "L4", "bf16")


def test_the_decode_probe_reads_the_requests_duration_not_bunched_chunk_gaps(monkeypatch):
    from types import SimpleNamespace

    import pytest

    from helpers.lessons import l05_quantization as l05

    # 32 tokens over 0.4 s, but arriving in one burst at the end: the chunk gaps would say 0.3 ms per token
    bunched = SimpleNamespace(ok=True, completion_tokens=32, t_sent=10.0, t_done=10.4, tpot_s=0.0003, error=None)
    monkeypatch.setattr(l05, "stream_chat", lambda *a, **k: bunched)
    lab = SimpleNamespace(client=None, model="tiny-agent")
    assert l05.decode_rate_tok_s(lab) == pytest.approx(80.0)
    monkeypatch.setattr(l05, "stream_chat", lambda *a, **k: SimpleNamespace(ok=False, completion_tokens=0, t_sent=1.0,
                                                                            t_done=None, error="HTTP 500"))
    with pytest.raises(RuntimeError, match="the decode probe got no timing: HTTP 500"):
        l05.decode_rate_tok_s(lab)


def test_size_check_on_an_engine_elsewhere_says_why_even_when_no_checkpoint_was_measured():
    # the FP8 checkpoint skipped as too slow on the cluster double's CPU pod: the baseline's size is still unknown here,
    # which is the reason to give, not a lack of data the run could have had
    seen, detail = size_check([{"config": "bf16 (baseline)"}])
    assert seen is None and "not on this machine" in detail
    seen, detail = size_check([row("bf16", 1, size=10.0)])  # the local path with every checkpoint skipped
    assert seen is None and detail == "no quantized checkpoint was measured in this run"
    assert size_check([]) == (None, "no quantized checkpoint was measured in this run")
