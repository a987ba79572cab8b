"""Why a measured price curve is steeper than the roofline's: what a real decode step pays beyond the ideal.

``token_price`` prices a token from the roofline: perfect memory bandwidth and compute, free tensor-parallel
communication, no time between steps. A real engine pays four things more, and each is taken here from a
published measurement, FIXED before any curve is drawn (``REAL_STEP``; never fitted to a price it should
explain):

1. achievable HBM bandwidth: weights and KV cache are read below the datasheet's peak;
2. achievable compute: matrix multiplies run below the dense tensor-core peak;
3. the tensor-parallel all-reduce: two per layer (after attention and after the MLP), each moving the step's
   activations (tokens x hidden size x 2 bytes) between the GPUs, with a latency floor however small;
4. a per-step overhead: the scheduler, input preparation and output processing between two GPU steps.

``term_attribution`` adds them one at a time (in that order) and says how much of the gap between the ideal
price and a reference price (the talk's) each term closes, and what is left unexplained. The order matters
(a term's share depends on those added before it); the order is fixed above and printed with the result.

Step time with the terms (batch B on N GPUs, tensor parallel, prompts prefilled in the same steps, ``s`` prompt
tokens per output token):
``max(W / (N BW e_w) + B c kv / (N BW e_kv), 2 P B (1 + s) / (N F e_c)) + 2 L t_ar(B (1 + s) H 2) + overhead``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion
from helpers.hardware.gpus import GPU
from helpers.planning.cost import usd_per_million_tokens
from helpers.planning.token_price import finish_price_axes

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


# ---------------------------------------------------------------- the published figures, fixed up front

# Measured vLLM custom all-reduce on 8x H100 (tensor parallel 8): (message bytes, seconds). sgl-project/sglang
# pull request #2904 "optimize custom allreduce kernel" (2025-01-15), table "vllm", tp size 8: data sizes 512 ..
# 1,048,576 float32 elements (sgl-kernel/tests/test_trt_reduce.py allocates float32, so bytes = 4 x elements),
# latencies 0.0101, 0.0093, 0.0118, 0.0241, 0.0304, 0.0450 ms; measured without CUDA graphs.
ALLREDUCE_TP8_H100 = ((2048, 10.1e-6), (16384, 9.3e-6), (131072, 11.8e-6), (1048576, 24.1e-6),
                      (2097152, 30.4e-6), (4194304, 45.0e-6))
# Beyond the largest measured message: NCCL's peak all-reduce bus bandwidth on 8x H100 with NVLink SHARP,
# "~480GB/s" (NVIDIA/nccl-tests issue #212, comment by sjeaugey, 2024-05-06).
NCCL_BUSBW_8X_H100_GB_S = 480.0


@dataclass(frozen=True)
class RealStep:
    """What a real decode step pays beyond the roofline: efficiencies (0..1], all-reduce, overhead; with sources."""

    weight_bandwidth: float = 0.78
    kv_bandwidth: float = 0.42
    compute: float = 797.8 / 989.0
    allreduce_points: tuple[tuple[int, float], ...] = ALLREDUCE_TP8_H100
    allreduce_busbw_gb_s: float = NCCL_BUSBW_8X_H100_GB_S
    step_overhead_s: float = 4e-3
    sources: Mapping[str, str] = field(default_factory=lambda: dict(_SOURCES))

    def __post_init__(self) -> None:
        for name in ("weight_bandwidth", "kv_bandwidth", "compute"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} is a share of the datasheet peak: it must be in (0, 1], got {value}")
        if self.step_overhead_s < 0:
            raise ValueError("step_overhead_s must not be negative")


_SOURCES = {
    "bandwidth": "weights read at 78% and KV cache at 42% of the 3.35 TB/s HBM peak: Nsight Compute on a 70B BF16 "
                 "model with tensor parallel 8 on H100 SXM (MLP weight load 2.6 TB/s, KV cache read 1.4 TB/s), "
                 "mikamirai.com/blog/gpu-memory-bandwidth (2026-03-28)",
    "compute": "cuBLAS BF16 matmul 8192^3 on H100 SXM: 797.8 TFLOPS of the 989 dense peak (81%), "
               "github.com/pranjalssh/fast.cu README (kernel 0), read 2026-12-01",
    "all-reduce": "vLLM custom all-reduce, tensor parallel 8 on H100: 9.3 us at 16 KiB to 45.0 us at 4 MiB, "
                  "github.com/sgl-project/sglang/pull/2904 (2025-01-15); larger messages at NCCL's ~480 GB/s bus "
                  "bandwidth, github.com/NVIDIA/nccl-tests/issues/212 (2024-05-06)",
    "overhead": "about 4 ms of GPU idle per decode step while the CPU schedules and processes outputs, in vLLM before "
                "multi-step scheduling: github.com/vllm-project/vllm/issues/6854 (2024-07-26); vLLM's async "
                "scheduling (pull request #19970, 2025-06-23) overlaps much of it",
}

REAL_STEP = RealStep()
TERMS = ("bandwidth", "compute", "all-reduce", "overhead")  # added in this order


def allreduce_s(message_bytes: float, num_gpus: int, step: RealStep = REAL_STEP) -> float:
    """Seconds for one all-reduce of ``message_bytes`` across ``num_gpus`` (0 on one GPU): the measured table,
    linear between its points, flat below its smallest, and at the bus bandwidth beyond its largest."""
    if num_gpus <= 1 or message_bytes <= 0:
        return 0.0
    points = sorted(step.allreduce_points)
    if message_bytes <= points[0][0]:
        return points[0][1]
    for (b0, t0), (b1, t1) in zip(points, points[1:]):
        if message_bytes <= b1:
            return t0 + (t1 - t0) * (message_bytes - b0) / (b1 - b0)
    last_bytes, last_s = points[-1]
    moved = (message_bytes - last_bytes) * 2 * (num_gpus - 1) / num_gpus
    return last_s + moved / (step.allreduce_busbw_gb_s * 1e9)


# ---------------------------------------------------------------- one step, with the terms switched on in order

@dataclass(frozen=True)
class Shape:
    """What the step arithmetic needs of a model: bytes, active parameters, KV bytes/token, layers, hidden size."""

    name: str
    weight_bytes: float
    active_params: float
    kv_bytes_per_token: float
    num_layers: int
    hidden_size: int


def shape_of(model: Any, config: Any) -> Shape:
    """``Shape`` from a ``token_price.ModelOnGPU`` and its published config (path or dict)."""
    from helpers.planning.shape import model_shape

    s = model_shape(config)
    return Shape(model.name, model.weight_bytes, model.active_params, model.kv_bytes_per_token, s.num_layers,
                 s.hidden_size)


def step_time_s(gpu: GPU, num_gpus: int, shape: Shape, batch: int, input_len: int, output_len: int,
                terms: Sequence[str] = TERMS, step: RealStep = REAL_STEP) -> float:
    """Seconds of one decode step of ``batch`` requests on ``num_gpus`` GPUs with ``terms`` of ``TERMS`` paid
    (none: the roofline of ``token_price``); prompts are prefilled in the same steps (chunked prefill)."""
    unknown = set(terms) - set(TERMS)
    if unknown:
        raise ValueError(f"unknown terms {sorted(unknown)}: choose from {', '.join(TERMS)}")
    bandwidth = num_gpus * gpu.bandwidth_bytes_per_s
    e_w, e_kv = (step.weight_bandwidth, step.kv_bandwidth) if "bandwidth" in terms else (1.0, 1.0)
    e_c = step.compute if "compute" in terms else 1.0
    context = input_len + output_len // 2  # mean context over a request's decode
    tokens = batch * (1 + input_len / output_len)  # output tokens plus their share of prompt tokens
    memory_s = shape.weight_bytes / (bandwidth * e_w) + batch * context * shape.kv_bytes_per_token / (bandwidth * e_kv)
    compute_s = 2.0 * shape.active_params * tokens / (num_gpus * gpu.peak_flops("bf16") * e_c)
    comm_s = 2 * shape.num_layers * allreduce_s(tokens * shape.hidden_size * 2, num_gpus, step) \
        if "all-reduce" in terms else 0.0
    return max(memory_s, compute_s) + comm_s + (step.step_overhead_s if "overhead" in terms else 0.0)


def cheapest_s(gpu: GPU, num_gpus: int, shape: Shape, max_batch: int, usd_per_hour: float, input_len: int,
               output_len: int, target_s: float, terms: Sequence[str] = TERMS,
               step: RealStep = REAL_STEP) -> dict[str, float]:
    """The largest batch (at most ``max_batch``) whose step meets ``target_s``, and its USD per million output
    tokens at ``usd_per_hour`` for the ``num_gpus`` GPUs; NaN price when even batch 1 is too slow."""
    def fits(b: int) -> bool:
        return step_time_s(gpu, num_gpus, shape, b, input_len, output_len, terms, step) <= target_s

    if max_batch < 1 or not fits(1):
        return {"batch": 0, "tpot_ms": math.nan, "usd_per_million_tokens": math.nan}
    lo, hi = 1, max_batch  # step time grows with the batch: bisect for the largest batch that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    tpot_s = step_time_s(gpu, num_gpus, shape, lo, input_len, output_len, terms, step)
    return {"batch": lo, "tpot_ms": tpot_s * 1e3,
            "usd_per_million_tokens": usd_per_million_tokens(usd_per_hour, lo / tpot_s)}


def term_prices(gpu: GPU, num_gpus: int, shape: Shape, max_batch: int, usd_per_hour: float, input_len: int,
                output_len: int, targets_ms: Sequence[float], step: RealStep = REAL_STEP) -> "pd.DataFrame":
    """One row per target (ms) and curve: "ideal", then each term of ``TERMS`` added to the ones before it
    (the last row per target is the fully adjusted price), with the batch and TPOT that price comes from."""
    import pandas as pd

    rows = []
    for target in targets_ms:
        for k in range(len(TERMS) + 1):
            best = cheapest_s(gpu, num_gpus, shape, max_batch, usd_per_hour, input_len, output_len, target / 1e3,
                              TERMS[:k], step)
            rows.append({"target_tpot_ms": target, "curve": "ideal" if k == 0 else f"+ {TERMS[k - 1]}", **best})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- against a reference curve (the talk's)

def term_attribution(prices: "pd.DataFrame", reference_usd: Mapping[float, float]) -> "pd.DataFrame":
    """Per target of ``reference_usd`` (ms -> USD per million tokens): the ideal, the adjusted and the reference
    price, and each term's share of the gap ideal -> reference (the price step it adds, over the gap), with the
    share left unexplained (negative: the adjusted price overshoots the reference)."""
    import pandas as pd

    rows = []
    for target, ref in reference_usd.items():
        curve = prices[prices["target_tpot_ms"] == target].set_index("curve")["usd_per_million_tokens"]
        if curve.empty:
            raise ValueError(f"no prices at {target} ms: compute term_prices for the reference's targets")
        ideal, adjusted = curve["ideal"], curve.iloc[-1]
        gap = ref - ideal
        row = {"target_tpot_ms": target, "ideal_usd": ideal, "adjusted_usd": adjusted, "reference_usd": ref}
        before = ideal
        for term in TERMS:
            now = curve[f"+ {term}"]
            row[f"{term}_share"] = (now - before) / gap if gap and not math.isnan(now) else math.nan
            before = now
        row["unexplained_share"] = (ref - adjusted) / gap if gap else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def attribution_sentences(table: "pd.DataFrame", reference: str) -> list[str]:
    """One sentence per target: ideal, adjusted and reference price, each term's share, what is left."""
    lines = []
    for r in table.to_dict("records"):
        target, ideal, adjusted, ref = r["target_tpot_ms"], r["ideal_usd"], r["adjusted_usd"], r["reference_usd"]
        blocker = next((t for t in TERMS if math.isnan(r[t + "_share"])), TERMS[-1])
        paid = [t for t in TERMS[:TERMS.index(blocker)] if not math.isnan(r[t + "_share"])]
        shares = ", ".join(f"{t} {r[t + '_share']:+.0%}" for t in (paid if math.isnan(adjusted) else TERMS))
        if math.isnan(adjusted):
            lines.append(f"<= {target:g} ms: ideal {ideal:.3f} USD per million output tokens, {reference} {ref:.2f}; of "
                         f"the gap: {shares or 'no term'}; then with the {blocker} no batch meets the target at "
                         "all (batch 1's step alone is longer).")
            continue
        left = r["unexplained_share"]
        rest = (f"{left:.0%} left unexplained" if left >= 0 else
                f"the adjusted price is {adjusted / ref:.1f}x {reference}'s, {-left:.0%} of the gap beyond it")
        lines.append(f"<= {target:g} ms: ideal {ideal:.3f}, adjusted {adjusted:.3f}, {reference} {ref:.2f} USD per "
                     f"million output tokens; of the gap ideal -> {reference}: {shares}; {rest}.")
    return lines


def gap_conclusions(attribution: "pd.DataFrame", reference: str, explained_within: float = 0.25,
                    margin: float = 0.05) -> list[Conclusion]:
    """From ``term_attribution``: whether the adjusted curve is steeper than the ideal one (beyond ``margin``, or
    missing a target the ideal meets), one line per target, and whether the terms explain ``reference``'s prices
    (adjusted within ``explained_within`` of it at every target) or over/undershoot them."""
    a = attribution.sort_values("target_tpot_ms")
    met = a.dropna(subset=["adjusted_usd"])
    missed = len(met) < len(a)
    ideal_x = a.ideal_usd.iloc[0] / a.ideal_usd.iloc[-1]
    adjusted_x = met.adjusted_usd.iloc[0] / met.adjusted_usd.iloc[-1] if len(met) >= 2 else math.nan
    text = (f"tightest over loosest target: ideal {ideal_x:.2f}x, adjusted "
            + ("n/a" if math.isnan(adjusted_x) else f"{adjusted_x:.2f}x")
            + (f"; the adjusted step cannot meet {a.target_tpot_ms.iloc[0]:g} ms at all" if missed else "")
            + " (fixed per-step costs weigh most where the batch is small)")
    steeper = missed or adjusted_x > ideal_x * (1 + margin)
    shape = Conclusion(text + ".", SHOWN if steeper else NOT_SHOWN,
                       "paying the real step's costs makes the price curve steeper than the roofline's")
    ratios = ", ".join(f"{r.adjusted_usd / r.reference_usd:.1f}x at {r.target_tpot_ms:g} ms" for r in met.itertuples())
    head = f"adjusted price over {reference}'s: {ratios or 'no target met'}"
    expectation = f"the published costs explain {reference}'s prices"
    if not missed and len(met) and ((met.adjusted_usd / met.reference_usd - 1).abs() <= explained_within).all():
        verdict = Conclusion(f"{head}: within {explained_within:.0%} at every target.", SHOWN, expectation)
    elif missed or (met.adjusted_usd > met.reference_usd).any():
        verdict = Conclusion(
            f"{head}: the published costs overshoot. They come from older or general stacks (an all-reduce timed "
            "without CUDA graphs, a scheduler before vLLM's multi-step and async scheduling), so whoever sells tokens "
            f"at {reference}'s prices runs a shorter step; and if {reference}'s price counts the input tokens too, its "
            "price per output token is higher than the figure shown.", NOT_SHOWN, expectation)
    else:
        verdict = Conclusion(f"{head}: {reference}'s prices stay higher; what is left lies outside a step's time: a "
                             "margin, idle hours, the hourly price paid.", NOT_SHOWN, expectation)
    return [shape, *map(Conclusion, attribution_sentences(a, reference)), verdict]


def plot_curves(prices: "pd.DataFrame", reference_usd: Mapping[float, float], reference: str, title: str) -> "Figure":
    """USD per million output tokens against the TPOT target: ideal, each term added, and the reference points."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4), constrained_layout=True)
    for name, frame in prices.groupby("curve", sort=False):
        style = {"linestyle": "--"} if name == "ideal" else {}
        ax.plot(frame["target_tpot_ms"], frame["usd_per_million_tokens"], marker=".", label=str(name), **style)
    ax.plot(list(reference_usd), list(reference_usd.values()), "k*", markersize=12, label=reference)
    return finish_price_axes(fig, ax, title)


def sources_text(step: RealStep = REAL_STEP) -> str:
    """The real step's figures, one line each with its source."""
    values = {"bandwidth": f"weights {step.weight_bandwidth:.0%}, KV {step.kv_bandwidth:.0%} of peak",
              "compute": f"{step.compute:.0%} of peak",
              "all-reduce": f"{len(step.allreduce_points)} measured sizes, then {step.allreduce_busbw_gb_s:g} GB/s",
              "overhead": f"{step.step_overhead_s * 1e3:g} ms per step"}
    return "\n".join(f"  {t}: {values[t]}; source: {step.sources.get(t, 'your own figure')}" for t in TERMS)
