"""Roofline: decode ceilings against model-math.md, compute-bound batch, MoE expert reads, measurement counting."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from helpers.hardware import gpus
from helpers.planning import roofline
from helpers.planning.shape import REFERENCE_CONFIGS, count_params
from helpers.planning.weights import active_weight_bytes, weight_bytes

CONFIGS = REFERENCE_CONFIGS


def test_gpu_lookup_ignores_case_and_punctuation() -> None:
    assert gpus.get_gpu("h100-sxm").name == "H100 SXM"
    assert gpus.get_gpu("rtx 4000 ada").bandwidth_gb_s == 360
    with pytest.raises(gpus.UnknownGPUError, match="known GPUs are L4, L40S"):
        gpus.get_gpu("Z100")
    for gpu in gpus.GPUS:
        assert gpu.memory_source and gpu.bandwidth_source and gpu.bf16_source and gpu.fp8_source
    with pytest.raises(ValueError, match="no FP8"):
        gpus.get_gpu("A100 80GB SXM").peak_flops("fp8")


@pytest.mark.parametrize("gpu,ceiling", [("L4", 37), ("RTX 4000 Ada", 45), ("A100 80GB SXM", 253),
                                         ("H100 SXM", 416), ("H200", 597)])
def test_batch1_ceiling_qwen3_4b_matches_model_math(gpu: str, ceiling: int) -> None:
    weights = weight_bytes(CONFIGS / "Qwen3-4B.json", "bf16")
    assert round(roofline.single_stream_tokens_per_s(gpus.get_gpu(gpu), weights)) == ceiling
    bound = roofline.decode_bound(gpus.get_gpu(gpu), weights, 4_022_468_096)
    assert bound.bound == "memory" and bound.tokens_per_s == pytest.approx(ceiling, abs=0.5)


def test_ridge_and_compute_bound_batch() -> None:
    h100 = gpus.get_gpu("H100 SXM")
    assert roofline.ridge_flop_per_byte(h100) == pytest.approx(989e12 / 3350e9)
    n = 8_030_261_248
    b_bf16 = roofline.compute_bound_batch(h100, 2.0 * n, n)
    assert round(b_bf16) == 295  # model-math.md: H100 SXM BF16 ~295
    assert roofline.compute_bound_batch(h100, 0.5 * n, n) == pytest.approx(b_bf16 / 4)  # W4A16 quarters it
    assert roofline.compute_bound_batch(h100, 1.0 * n, n, compute_dtype="fp8") == pytest.approx(b_bf16, rel=1e-3)  # W8A8 keeps it
    # With KV reads (100 tokens of context each), B* grows, and at B* memory and compute time are equal.
    b = roofline.compute_bound_batch(h100, 2.0 * n, n, context_tokens=100, kv_bytes_per_token=131_072)
    at_b = roofline.decode_bound(h100, 2.0 * n, n, batch=round(b), context_tokens=100, kv_bytes_per_token=131_072)
    assert b > b_bf16
    assert at_b.memory_time_s == pytest.approx(at_b.compute_time_s, rel=1e-2)
    # From ~400 tokens of context on, each sequence's KV reads take longer than its FLOPs: never compute bound.
    assert roofline.compute_bound_batch(h100, 2.0 * n, n, context_tokens=1000, kv_bytes_per_token=131_072) == math.inf


def test_decode_sweep_turns_compute_bound() -> None:
    h100 = gpus.get_gpu("H100 SXM")
    sweep = roofline.decode_sweep(h100, 16e9, 8_000_000_000, [1, 64, 1024])
    assert [b.bound for b in sweep] == ["memory", "memory", "compute"]
    assert sweep[0].tokens_per_s_per_user == pytest.approx(3350e9 / 16e9)
    assert sweep[2].tokens_per_s == pytest.approx(989e12 / (2 * 8e9))


def test_expected_distinct_experts_qwen3_30b() -> None:
    values = [roofline.expected_distinct_experts(128, 8, b) for b in (1, 8, 32, 64)]
    assert [round(v, 1) for v in values] == [8.0, 51.6, 111.8, 125.9]  # model-math.md


def test_moe_bytes_per_step_between_active_and_total() -> None:
    counts = count_params(CONFIGS / "Qwen3-30B-A3B.json")
    assert roofline.moe_bytes_per_step(counts, 1) == pytest.approx(active_weight_bytes(counts))
    assert roofline.moe_bytes_per_step(counts, 10_000) == pytest.approx(weight_bytes(counts))
    at8 = roofline.moe_bytes_per_step(counts, 8)
    expert = 3 * 2048 * 768 * 2
    assert at8 - roofline.moe_bytes_per_step(counts, 1) == pytest.approx(48 * (51.60 - 8) * expert, rel=1e-3)
    dense = count_params(CONFIGS / "Qwen3-4B.json")
    assert roofline.moe_bytes_per_step(dense, 32) == weight_bytes(dense)


def test_prefill_flops_ttft_and_mbu() -> None:
    h100 = gpus.get_gpu("H100 SXM")
    flops = roofline.prefill_flops(8_000_000_000, 1000, 32, 32, 128)
    assert flops == 2 * 8e9 * 1000 + 2 * 32 * 32 * 128 * 1000**2
    assert roofline.ttft_lower_bound_s(h100, flops, mfu=0.5) == pytest.approx(flops / (989e12 * 0.5))
    assert roofline.ttft_lower_bound_s(h100, 1.0, weight_bytes=16e9) == pytest.approx(16e9 / 3350e9)
    assert roofline.mbu(16e9, 16e9 / 3350e9, 3350) == pytest.approx(1.0)
    assert roofline.mbu(16e9, 0.01, 3350) == pytest.approx(16e9 / 0.01 / 3350e9)
    with pytest.raises(ValueError, match="measure"):
        roofline.mbu(16e9, 0, 3350)


def test_bandwidth_counts_read_and_write_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(step=0.01)  # every copy takes 10 ms on this fake clock
    monkeypatch.setattr(roofline.time, "perf_counter", lambda: next(clock))
    assert roofline.measure_memory_bandwidth_gb_s(size_mib=8, repeats=3) == pytest.approx(2 * 8 * 2**20 / 0.01 / 1e9)
    assert roofline.measure_matmul_tflops(n=64, repeats=2) == pytest.approx(2 * 64**3 / 0.01 / 1e12)


def test_bandwidth_measurement_runs_on_this_machine() -> None:
    measured = roofline.measure_memory_bandwidth_gb_s(size_mib=16, repeats=2)
    assert math.isfinite(measured) and measured > 0
    spec = roofline.cpu_spec(measured, 0.1)
    assert spec.bandwidth_gb_s == measured and spec.memory_bytes > 0 and spec.fp8_tflops is None
    assert roofline.ridge_flop_per_byte(spec) == pytest.approx(0.1e12 / (measured * 1e9))


def test_plots_return_figures() -> None:
    h100 = gpus.get_gpu("H100 SXM")
    sweep = roofline.decode_sweep(h100, 16e9, 8_000_000_000, [1, 8, 64])
    fig = roofline.plot_roofline(h100, [roofline.decode_point(b) for b in sweep])
    assert len(fig.axes[0].lines) == 2 + len(sweep)  # roof, ridge, one marker per point
    point = roofline.decode_point(sweep[0], step_time_s=2 * sweep[0].step_time_s)
    assert point.flops_per_s == pytest.approx(sweep[0].flops_per_step / sweep[0].step_time_s / 2)
    fig2 = roofline.plot_decode_sweep(sweep, measured_tokens_per_s={1: 150.0, 8: 1100.0})
    assert len(fig2.axes[0].lines) == 4
    plt.close(fig)
    plt.close(fig2)


def test_cpu_roof_is_labelled_with_the_dtype_it_was_measured_in():
    import matplotlib.pyplot as plt

    spec = roofline.cpu_spec(20.0, 0.5, memory_bytes=2**34)
    fig = roofline.plot_roofline(spec, compute_label="FP32 matmul, measured")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("FP32 matmul" in label for label in labels) and "FP32" in fig.axes[0].get_ylabel()
    plt.close(fig)


def test_labels_of_close_points_are_staggered():
    from helpers.planning.roofline import LABEL_OFFSETS, RooflinePoint, label_offset

    dense, moe, far = RooflinePoint("dense B=4", 2.0, 1e11), RooflinePoint("moe B=4", 2.2, 1.1e11), RooflinePoint("x", 200, 1e13)
    assert label_offset([], dense) == LABEL_OFFSETS[0]
    assert label_offset([dense], moe) == LABEL_OFFSETS[1]  # close on both axes: the next slot
    assert label_offset([dense, moe], far) == LABEL_OFFSETS[0]  # far away: the first slot
