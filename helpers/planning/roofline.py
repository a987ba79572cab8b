"""Roofline: the ceilings memory bandwidth and compute put on decode and prefill, and MoE weight reads.

Formulas: the roofline model (Williams, Waterman and Patterson, "Roofline: an insightful visual performance
model for multicore architectures", CACM 52(4), 2009). Bytes in bytes, bandwidth in GB/s (1e9 B/s),
throughput in FLOP/s unless a name says TFLOP/s. Plot functions take results and return a Figure.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from helpers.hardware.gpus import GPU
from helpers.planning.shape import ParamCounts
from helpers.planning.weights import weight_bytes, weight_format

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class DecodeBound:
    """Lower bound on one decode step of ``batch`` sequences, each ``context_tokens`` long."""

    batch: int
    context_tokens: int
    bytes_per_step: float  # weights + the KV cache of every sequence
    flops_per_step: float  # 2 * active params * batch
    memory_time_s: float
    compute_time_s: float

    @property
    def step_time_s(self) -> float:
        """The step cannot be faster than its slower resource."""
        return max(self.memory_time_s, self.compute_time_s)

    @property
    def bound(self) -> str:
        """"memory" or "compute": which ceiling sets the step time."""
        return "compute" if self.compute_time_s > self.memory_time_s else "memory"

    @property
    def tokens_per_s(self) -> float:
        """Ceiling on output tokens per second, all sequences together."""
        return self.batch / self.step_time_s

    @property
    def tokens_per_s_per_user(self) -> float:
        """Ceiling on output tokens per second of one sequence (1 / TPOT)."""
        return 1.0 / self.step_time_s


def decode_bound(gpu: GPU, weight_bytes: float, active_params: int, batch: int = 1, context_tokens: int = 0,
                 kv_bytes_per_token: int = 0, compute_dtype: str = "bf16") -> DecodeBound:
    """Decode step bound: max((W + B*c*kv)/BW, 2*N_act*B/F) for batch B at context c."""
    if batch < 1:
        raise ValueError("batch must be at least 1")
    bytes_per_step = weight_bytes + batch * context_tokens * kv_bytes_per_token
    flops = 2.0 * active_params * batch
    return DecodeBound(batch, context_tokens, bytes_per_step, flops,
                       bytes_per_step / gpu.bandwidth_bytes_per_s, flops / gpu.peak_flops(compute_dtype))


def decode_sweep(gpu: GPU, weight_bytes: float, active_params: int, batches: Sequence[int], context_tokens: int = 0,
                 kv_bytes_per_token: int = 0, compute_dtype: str = "bf16") -> list[DecodeBound]:
    """decode_bound for each batch size in ``batches``."""
    return [decode_bound(gpu, weight_bytes, active_params, b, context_tokens, kv_bytes_per_token, compute_dtype)
            for b in batches]


def single_stream_tokens_per_s(gpu: GPU, weight_bytes: float) -> float:
    """Batch-1 decode ceiling from weight reads alone: BW / W tokens per second."""
    return gpu.bandwidth_bytes_per_s / weight_bytes


def ridge_flop_per_byte(gpu: GPU, compute_dtype: str = "bf16") -> float:
    """Arithmetic intensity (FLOP/byte) above which a kernel is compute bound: F / BW."""
    return gpu.peak_flops(compute_dtype) / gpu.bandwidth_bytes_per_s


def compute_bound_batch(gpu: GPU, weight_bytes: float, active_params: int, context_tokens: int = 0,
                        kv_bytes_per_token: int = 0, compute_dtype: str = "bf16") -> float:
    """Batch at which a dense model's decode turns compute bound; ``math.inf`` if it never does.

    Solves (W + B*c*kv)/BW = 2*N*B/F. Weights only (c = 0): B* = (F/BW) * (W/N) / 2.
    """
    compute_s = 2.0 * active_params / gpu.peak_flops(compute_dtype)
    per_seq = compute_s - context_tokens * kv_bytes_per_token / gpu.bandwidth_bytes_per_s
    if per_seq <= 0:
        return math.inf
    return (weight_bytes / gpu.bandwidth_bytes_per_s) / per_seq


def prefill_flops(active_params: int, prompt_tokens: int, num_layers: int, num_heads: int, head_dim: int) -> float:
    """FLOPs of a prefill of T tokens: 2*N_act*T + 2*L*nh*hd*T^2 (causal attention)."""
    return 2.0 * active_params * prompt_tokens + 2.0 * num_layers * num_heads * head_dim * prompt_tokens**2


def ttft_lower_bound_s(gpu: GPU, flops: float, weight_bytes: float = 0.0, mfu: float = 1.0,
                       compute_dtype: str = "bf16") -> float:
    """TTFT floor in seconds: max(FLOPs / (F*MFU), W / BW) (a prefill computes all and reads all weights)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    return max(flops / (gpu.peak_flops(compute_dtype) * mfu), weight_bytes / gpu.bandwidth_bytes_per_s)


def mbu(bytes_per_step: float, tpot_s: float, bandwidth_gb_s: float) -> float:
    """Memory-bandwidth utilization: bytes read per decode step (weights + KV) / TPOT / bandwidth."""
    if tpot_s <= 0:
        raise ValueError("tpot_s must be positive: measure a time per output token first")
    return bytes_per_step / tpot_s / (bandwidth_gb_s * 1e9)


def expected_distinct_experts(num_experts: int, experts_per_token: int, batch: int) -> float:
    """Expected distinct experts a batch of B tokens touches in one layer: E*(1-(1-k/E)^B)."""
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** batch)


def moe_bytes_per_step(counts: ParamCounts, batch: int, weight_dtype: str = "bf16") -> float:
    """Weight bytes one decode step of ``batch`` tokens reads from a MoE: shared part + touched experts."""
    if counts.num_experts == 0:
        return float(weight_bytes(counts, weight_dtype))
    expert_bytes = counts.expert_params * float(weight_format(weight_dtype).bits_per_weight) / 8
    routed_bytes = counts.num_moe_layers * counts.num_experts * expert_bytes
    touched = expected_distinct_experts(counts.num_experts, counts.experts_per_token, batch)
    return weight_bytes(counts, weight_dtype) - routed_bytes + counts.num_moe_layers * touched * expert_bytes


# ---------------------------------------------------------------------------------------------
# This machine


def measure_memory_bandwidth_gb_s(size_mib: int = 64, repeats: int = 5) -> float:
    """Copy bandwidth of this machine in GB/s: best of ``repeats`` numpy copies, read + write bytes counted.

    Counts 2 bytes moved per byte copied, as STREAM's Copy does (write-allocate traffic is not counted).
    """
    import numpy as np

    src = np.ones(size_mib * (1 << 20) // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch: page faults are not bandwidth
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


def measure_matmul_tflops(n: int = 1024, repeats: int = 3) -> float:
    """FP32 matrix-multiply throughput of this machine in TFLOP/s: best of ``repeats`` n x n numpy matmuls."""
    import numpy as np

    a = np.ones((n, n), dtype=np.float32)
    b = np.ones((n, n), dtype=np.float32)
    a @ b  # warm-up: BLAS threads and buffers
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best / 1e12


def cpu_spec(bandwidth_gb_s: float, peak_tflops: float, memory_bytes: int | None = None,
             name: str = "this CPU") -> GPU:
    """A GPU-like spec of this machine for rooflines, from figures you measured (see measure_*)."""
    if memory_bytes is None:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return GPU(name, memory_bytes, bandwidth_gb_s, peak_tflops, None,
               memory_source="os.sysconf: physical pages x page size",
               bandwidth_source="measured: measure_memory_bandwidth_gb_s (numpy copy)",
               bf16_source="measured: measure_matmul_tflops (numpy FP32 matmul)",
               fp8_source="none: no FP8 matrix units assumed",
               note="measured on this machine, not a datasheet")


# ---------------------------------------------------------------------------------------------
# Plots


@dataclass(frozen=True)
class RooflinePoint:
    """A kernel or step placed on the roofline: its arithmetic intensity and the FLOP/s it reached."""

    label: str
    flop_per_byte: float
    flops_per_s: float


def decode_point(bound: DecodeBound, step_time_s: float | None = None, label: str | None = None) -> RooflinePoint:
    """Roofline point of a decode step: at its ceiling, or at a measured ``step_time_s`` (TPOT)."""
    time_s = bound.step_time_s if step_time_s is None else step_time_s
    return RooflinePoint(label or f"decode B={bound.batch}", bound.flops_per_step / bound.bytes_per_step,
                         bound.flops_per_step / time_s)


LABEL_OFFSETS = ((4, 4), (4, -12), (4, 16), (4, -24), (4, 28))  # points: right, then alternately below and above


def label_offset(placed: Sequence[RooflinePoint], point: RooflinePoint, near_decades: float = 0.15) -> tuple[int, int]:
    """Where ``point``'s label goes (offset in points): one step further from the first slot for each point
    already ``placed`` within ``near_decades`` of it on both log axes, so labels of close points do not overlap."""
    import math

    def near(other: RooflinePoint) -> bool:
        return (abs(math.log10(other.flop_per_byte / point.flop_per_byte)) < near_decades
                and abs(math.log10(other.flops_per_s / point.flops_per_s)) < near_decades)

    return LABEL_OFFSETS[min(sum(map(near, placed)), len(LABEL_OFFSETS) - 1)]


def plot_roofline(gpu: GPU, points: Sequence[RooflinePoint] = (), compute_dtype: str = "bf16",
                  compute_label: str | None = None) -> "Figure":
    """Log-log roofline of ``gpu`` (FLOP/s against FLOP/byte) with ``points`` on it; ``compute_label``
    names what the compute ceiling was measured in (e.g. "FP32 matmul" for ``cpu_spec``), else the dtype."""
    import matplotlib.pyplot as plt

    peak = gpu.peak_flops(compute_dtype)
    ridge = ridge_flop_per_byte(gpu, compute_dtype)
    xs = [p.flop_per_byte for p in points] + [ridge]
    lo, hi = min(xs) / 4, max(xs) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(8.5, 4), constrained_layout=True)
    ax.loglog(grid, [min(peak, x * gpu.bandwidth_bytes_per_s) / 1e12 for x in grid], color="black",
              label=f"{gpu.name} roof (compute: {compute_label or compute_dtype.upper()})")
    ax.axvline(ridge, color="grey", linestyle=":", label=f"ridge {ridge:.0f} FLOP/byte")
    for i, p in enumerate(points):
        ax.loglog([p.flop_per_byte], [p.flops_per_s / 1e12], "o")
        ax.annotate(p.label, (p.flop_per_byte, p.flops_per_s / 1e12), textcoords="offset points",
                    xytext=label_offset(points[:i], p))
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel(f"TFLOP/s ({compute_label or compute_dtype.upper()})")
    ax.set_ylim(top=peak / 1e12 * 3)  # room above the roof for the labels of compute-bound points
    ax.set_title(f"Roofline: {gpu.name}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")  # outside: the points sit low right
    return fig


def plot_decode_sweep(bounds: Sequence[DecodeBound], measured_tokens_per_s: Mapping[int, float] | None = None,
                      title: str = "decode ceiling") -> "Figure":
    """Total decode tokens/s against batch: the ceiling from ``bounds`` and optional measured points."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    batches = [b.batch for b in bounds]
    ax.plot(batches, [b.tokens_per_s for b in bounds], marker=".", label="roofline ceiling")
    ax.plot(batches, [b.batch / b.memory_time_s for b in bounds], linestyle="--", label="memory bound")
    ax.plot(batches, [b.batch / b.compute_time_s for b in bounds], linestyle=":", label="compute bound")
    if measured_tokens_per_s:
        ax.plot(list(measured_tokens_per_s), list(measured_tokens_per_s.values()), "o", label="measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (concurrent sequences)")
    ax.set_ylabel("output tokens/s (all sequences)")
    ax.set_title(title)
    ax.legend()
    return fig
