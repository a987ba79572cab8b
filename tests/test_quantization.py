"""Notebook 05's judgement, fed numbers that go both ways."""

from __future__ import annotations

from helpers.quantization import chosen_kernels, conclusions, skip_reason, too_slow_reason
from helpers.settings import models_dir

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
