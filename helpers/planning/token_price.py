"""The price of a token against the per-token latency target: the faster each user's tokens, the dearer.

One machine rented at a price per hour serves a batch of users; each user sees one token per engine step
(TPOT), and all users together get ``batch / step`` tokens per second. A bigger batch makes each step a
little slower and the hour a lot more productive. So a latency target (TPOT <= T) caps the batch, and the
cheapest way to meet it is the largest batch whose TPOT still meets T: USD per million output tokens =
hourly price / (tokens/s x 3600) x 1e6 (helpers/planning/cost.py).

Two sources for the (TPOT, tokens/s) points:
- this machine: the runs of a concurrency sweep (notebook 07), per-user median TPOT and total output
  throughput, measured;
- a GPU of helpers/hardware/gpus.py: the roofline (helpers/planning/roofline.py) of a decode step at batch B on N GPUs with
  tensor parallelism, taken as ideal (N times the bandwidth and the FLOP/s). Each step also prefills the
  batch's share of prompts (``input_len / output_len`` prompt tokens per output token, as chunked prefill
  mixes them in; attention's own FLOPs are left out), and the KV cache of a whole request (input + output
  tokens) must fit next to the weights. These are ceilings: the prices are floors a real engine does not reach.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from helpers.core.comparison import SINGLE_RUN_NOISE_REL
from helpers.core.lesson import ratio_outcome
from helpers.planning.cost import price_latency_frame, usd_per_million_tokens
from helpers.hardware.gpus import GPU
from helpers.planning.roofline import decode_bound

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

GPU_COUNTS = (1, 2, 4, 8)  # tensor-parallel sizes tried: one 8-GPU server at most
ROOFLINE_MARGIN = 0.05  # computed prices closer than this are "the same": the model is not that exact
MEMORY_UTILIZATION = 0.90  # share of each GPU's memory for weights + KV cache (vLLM's --gpu-memory-utilization)


# ---------------------------------------------------------------- this machine, from a measured sweep

def sweep_price_frame(tables: Mapping[str, "pd.DataFrame"], hourly_usd: float) -> "pd.DataFrame":
    """USD per million output tokens for every run of the sweeps in ``tables`` (label -> a sweep table with
    ``concurrency``, ``output_throughput`` in tokens/s and ``median_tpot_ms``), one row per run."""
    import pandas as pd

    frames = []
    for label, table in tables.items():
        points = [{"concurrency": r.concurrency, "output_tokens_per_s": r.output_throughput,
                   "tpot_s": r.median_tpot_ms / 1e3} for r in table.itertuples()
                  if r.output_throughput and r.output_throughput > 0 and r.median_tpot_ms and r.median_tpot_ms > 0]
        if points:
            frames.append(price_latency_frame(points, hourly_usd).assign(setup=label))
    if not frames:
        raise ValueError("no run with a throughput and a TPOT: run the sweep first")
    return pd.concat(frames, ignore_index=True)


def relative_targets_ms(tpot_c1_ms: float, multiples: Sequence[float]) -> list[float]:
    """TPOT targets in ms as ``multiples`` of this machine's unloaded (concurrency-1) median TPOT."""
    if not tpot_c1_ms or tpot_c1_ms <= 0:
        raise ValueError("need the concurrency-1 run's median TPOT (ms): run the sweep from concurrency 1")
    return [round(m * tpot_c1_ms, 2) for m in sorted(multiples)]


def cheapest_at_targets(frame: "pd.DataFrame", targets_ms: Iterable[float]) -> "pd.DataFrame":
    """For each TPOT target (ms), the cheapest row of ``frame`` whose ``tpot_ms`` meets it; a target no row
    meets keeps its row with an empty price (NaN)."""
    import pandas as pd

    rows = []
    for target in targets_ms:
        meeting = frame[frame["tpot_ms"] <= target]
        if len(meeting):
            best = meeting.loc[meeting["usd_per_million_tokens"].idxmin()].to_dict()
            rows.append({"target_tpot_ms": target, **best})
        else:
            rows.append({"target_tpot_ms": target, "usd_per_million_tokens": math.nan})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- a GPU, from the roofline

@dataclass(frozen=True)
class ModelOnGPU:
    """A model as the roofline sees it: weight bytes, active parameters and KV bytes per token (all GPUs)."""

    name: str
    weight_bytes: int
    active_params: int
    kv_bytes_per_token: int


def model_on_gpu(name: str, config: Any, weight_dtype: str = "bf16", kv_dtype: str = "bf16") -> ModelOnGPU:
    """``ModelOnGPU`` from a published config (helpers/planning/shape.py counts its parameters, kv.py its KV bytes)."""
    from helpers.planning.kv import kv_cache_bytes
    from helpers.planning.shape import count_params
    from helpers.planning.weights import weight_bytes

    counts = count_params(config)
    return ModelOnGPU(name, weight_bytes(counts, weight_dtype), counts.active, kv_cache_bytes(config, kv_dtype).bytes_per_token)


def max_batch(gpu: GPU, num_gpus: int, model: ModelOnGPU, request_tokens: int,
              memory_utilization: float = MEMORY_UTILIZATION) -> int:
    """Requests of ``request_tokens`` (input + output) whose KV cache fits beside the weights on ``num_gpus``
    GPUs (driver-reported memory x ``memory_utilization``); 0 when the weights alone do not fit."""
    kv_room = num_gpus * gpu.usable_memory_bytes * memory_utilization - model.weight_bytes
    return max(0, int(kv_room // (request_tokens * model.kv_bytes_per_token)))


def min_gpus(gpu: GPU, model: ModelOnGPU, request_tokens: int, counts: Sequence[int] = GPU_COUNTS,
             memory_utilization: float = MEMORY_UTILIZATION) -> int | None:
    """The fewest GPUs of ``counts`` that hold the weights and at least one request's KV; None if none do."""
    return next((n for n in counts if max_batch(gpu, n, model, request_tokens, memory_utilization) >= 1), None)


def _batches(limit: int, points: int = 64) -> list[int]:
    """About ``points`` batch sizes from 1 to ``limit``, evenly spaced on a log scale."""
    return sorted({max(1, round(limit ** (i / (points - 1)))) for i in range(points)} | {limit})


def roofline_price_frame(gpu: GPU, num_gpus: int, model: ModelOnGPU, hourly_usd_per_gpu: float, input_len: int,
                         output_len: int, memory_utilization: float = MEMORY_UTILIZATION,
                         compute_dtype: str = "bf16") -> "pd.DataFrame":
    """TPOT, output tokens/s and USD per million output tokens at every batch that fits, on ``num_gpus`` GPUs
    (ideal tensor parallelism), for requests of ``input_len`` prompt and ``output_len`` output tokens."""
    import pandas as pd

    limit = max_batch(gpu, num_gpus, model, input_len + output_len, memory_utilization)
    if limit < 1:
        raise ValueError(f"{model.name} does not fit on {num_gpus}x {gpu.name}: use more GPUs (min_gpus)")
    group = replace(gpu, bandwidth_gb_s=gpu.bandwidth_gb_s * num_gpus, bf16_tflops=gpu.bf16_tflops * num_gpus,
                    fp8_tflops=None if gpu.fp8_tflops is None else gpu.fp8_tflops * num_gpus)
    prefill_share = input_len / output_len  # prompt tokens computed per output token
    rows = []
    for batch in _batches(limit):
        step = decode_bound(group, model.weight_bytes, model.active_params, batch, input_len + output_len // 2,
                            model.kv_bytes_per_token, compute_dtype)
        step_s = max(step.memory_time_s, step.compute_time_s * (1 + prefill_share))
        tokens_per_s = batch / step_s
        rows.append({"setup": f"{num_gpus}x {gpu.name}", "gpu": gpu.name, "num_gpus": num_gpus, "concurrency": batch,
                     "tpot_ms": step_s * 1e3, "output_tokens_per_s": tokens_per_s,
                     "bound": "compute" if step.compute_time_s * (1 + prefill_share) > step.memory_time_s else "memory",
                     "usd_per_hour": hourly_usd_per_gpu * num_gpus,
                     "usd_per_million_tokens": usd_per_million_tokens(hourly_usd_per_gpu * num_gpus, tokens_per_s)})
    return pd.DataFrame(rows)


def gpu_price_frame(gpu: GPU, model: ModelOnGPU, hourly_usd_per_gpu: float, input_len: int, output_len: int,
                    counts: Sequence[int] = GPU_COUNTS, memory_utilization: float = MEMORY_UTILIZATION) -> "pd.DataFrame":
    """``roofline_price_frame`` for every GPU count of ``counts`` that holds the model (more GPUs: faster steps)."""
    import pandas as pd

    frames = [roofline_price_frame(gpu, n, model, hourly_usd_per_gpu, input_len, output_len, memory_utilization)
              for n in counts if max_batch(gpu, n, model, input_len + output_len, memory_utilization) >= 1]
    if not frames:
        raise ValueError(f"{model.name} does not fit on {max(counts)}x {gpu.name}")
    return pd.concat(frames, ignore_index=True)


def gpu_price_table(prices: Mapping[str, float], model: ModelOnGPU, targets_ms: Sequence[float], input_len: int,
                    output_len: int) -> "pd.DataFrame":
    """One row per GPU of ``prices`` (GPU name -> USD per GPU-hour) and target: the cheapest setup (GPUs,
    batch) whose roofline TPOT meets the target, its price per million output tokens, and the GPUs needed."""
    import pandas as pd

    from helpers.hardware.gpus import get_gpu

    rows = []
    for name, price in prices.items():
        gpu = get_gpu(name)
        need = min_gpus(gpu, model, input_len + output_len)
        if need is None:
            continue
        best = cheapest_at_targets(gpu_price_frame(gpu, model, price, input_len, output_len), targets_ms)
        rows += [{**r, "gpu": gpu.name, "usd_per_gpu_hour": price, "min_gpus": need}
                 for r in best.to_dict("records")]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- the figure

def finish_price_axes(fig: "Figure", ax: Any, title: str) -> "Figure":
    """The price plots' axes: USD per million output tokens (log) against the TPOT target (ms), legend outside."""
    ax.set_yscale("log")
    ax.set_xlabel("target: time per output token per user (ms)")
    ax.set_ylabel("USD per million output tokens")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


def plot_price_vs_target(curves: Mapping[str, "pd.DataFrame"], title: str) -> "Figure":
    """USD per million output tokens (log) against the TPOT target (ms): one line per ``cheapest_at_targets``
    frame of ``curves`` (label -> frame); a target a setup cannot meet leaves a gap."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for label, frame in curves.items():
        ax.plot(frame["target_tpot_ms"], frame["usd_per_million_tokens"], marker="o", drawstyle="steps-post", label=label)
    return finish_price_axes(fig, ax, title)


# ---------------------------------------------------------------- the notebook's inputs

def reference_config(model: str) -> Any:
    """The published config.json of ``model`` shipped in helpers/data/configs (e.g. "Llama-3.3-70B")."""
    from helpers.planning.shape import REFERENCE_CONFIGS

    path = REFERENCE_CONFIGS / f"{model}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in REFERENCE_CONFIGS.glob("*.json")))
        raise ValueError(f"no published config for {model!r}: choose one of {known}")
    return path


def gpu_prices() -> dict[str, float]:
    """USD per GPU-hour of every GPU with a list price in the facts table (helpers/hardware/gpus.py HOURLY_PRICES)."""
    from helpers.hardware.gpus import GPUS, HOURLY_PRICES

    names = {g.name for g in GPUS}
    return {p.name: p.usd_per_hour for p in HOURLY_PRICES if p.name in names}


def price_sources() -> str:
    """The facts table's prices, one line each with its source."""
    from helpers.hardware.gpus import HOURLY_PRICES

    return "Hourly prices (facts table, helpers/hardware/gpus.py):\n" + "\n".join(
        f"  {p.name}: {p.usd_per_hour:g} USD/h; source: {p.source}" for p in HOURLY_PRICES)


def machine_price(profile: str, hourly_usd: float | None = None) -> tuple[float, str]:
    """(USD per hour, its source) for the machine the sweep ran on: ``hourly_usd`` when given, else the facts
    table's 2-vCPU VM on the CPU profile, one H100 SXM otherwise (an assumption the source says)."""
    from helpers.hardware.gpus import hourly_price

    if hourly_usd is not None:
        if hourly_usd <= 0:
            raise ValueError(f"HOURLY_USD must be a positive price in USD per hour, got {hourly_usd}")
        return float(hourly_usd), "your HOURLY_USD parameter"
    if profile == "cpu":
        price = hourly_price("2-vCPU VM")
        return price.usd_per_hour, f"a comparable VM's list price: {price.source}; set HOURLY_USD for your machine"
    price = hourly_price("H100 SXM")
    return price.usd_per_hour, f"assumed one H100 SXM: {price.source}; set HOURLY_USD to your GPU's price"


def fits(gpu: str, model: ModelOnGPU, request_tokens: int) -> bool:
    """Whether ``model`` and one request's KV fit on at most 8 of ``gpu``."""
    from helpers.hardware.gpus import get_gpu

    return min_gpus(get_gpu(gpu), model, request_tokens) is not None


def gpu_curves(model: ModelOnGPU, input_len: int, output_len: int, targets_ms: Iterable[float]) -> dict[str, "pd.DataFrame"]:
    """GPU name -> ``cheapest_at_targets`` over its roofline setups, for every priced GPU the model fits on."""
    from helpers.hardware.gpus import get_gpu

    targets = list(targets_ms)
    return {name: cheapest_at_targets(gpu_price_frame(get_gpu(name), model, price, input_len, output_len), targets)
            for name, price in gpu_prices().items() if fits(name, model, input_len + output_len)}


def price_at(gpu: str, model: ModelOnGPU, target_ms: float, input_len: int, output_len: int) -> dict[str, Any]:
    """The cheapest roofline setup of ``gpu`` meeting ``target_ms``: its ``usd_per_million_tokens`` (NaN:
    none), ``num_gpus``, ``concurrency`` and what bounds its step (``bound``: memory or compute)."""
    table = gpu_price_table({gpu: gpu_prices()[gpu]}, model, [target_ms], input_len, output_len)
    return table.iloc[0].to_dict() if len(table) else {"usd_per_million_tokens": math.nan, "bound": "does not fit"}


def price_pivot(table: "pd.DataFrame") -> "pd.DataFrame":
    """``gpu_price_table`` as GPUs x targets: "USD/M (GPUs x batch)", "-" where a target is out of reach."""
    def cell(r: Any) -> str:
        if math.isnan(r.usd_per_million_tokens):
            return "-"
        return f"{r.usd_per_million_tokens:.3g} ({r.num_gpus:.0f} GPUs x {r.concurrency:.0f})"

    shown = table.assign(price=[cell(r) for r in table.itertuples()],
                         target=[f"<= {t:g} ms" for t in table.target_tpot_ms])
    return shown.pivot(index="gpu", columns="target", values="price").reindex(columns=shown.target.unique())


def group_tpot_ms(gpu: str, num_gpus: int, model: ModelOnGPU, batch: int, context_tokens: int,
                  compute_dtype: str = "bf16") -> float:
    """Roofline TPOT in ms of a decode step of ``batch`` sequences at ``context_tokens`` on ``num_gpus`` of ``gpu``
    (ideal tensor parallelism: N times one GPU's bandwidth and FLOP/s)."""
    from helpers.hardware.gpus import get_gpu

    one = get_gpu(gpu)
    group = replace(one, bandwidth_gb_s=one.bandwidth_gb_s * num_gpus, bf16_tflops=one.bf16_tflops * num_gpus,
                    fp8_tflops=None if one.fp8_tflops is None else one.fp8_tflops * num_gpus)
    step = decode_bound(group, model.weight_bytes, model.active_params, batch, context_tokens,
                        model.kv_bytes_per_token, compute_dtype)
    return step.step_time_s * 1e3


# ---------------------------------------------------------------- notebook 07's exercise: a looser latency target

PRICE_CHOICES = ("cheaper", "about the same", "dearer")


def looser_target_outcome(runs: pd.DataFrame, here: pd.DataFrame, looser_x: float = 2,
                          noise_rel: float = SINGLE_RUN_NOISE_REL) -> tuple[str, str]:
    """The exercise "a looser latency target": the price per million tokens at ``looser_x`` times the tightest TPOT
    target met (``here``, a ``cheapest_at_targets`` frame of ``runs``) against the price at that target: one of
    ``PRICE_CHOICES`` (about the same within ``noise_rel``), and the numbers with the reason."""
    met = here.dropna(subset=["usd_per_million_tokens"]).sort_values("target_tpot_ms")
    if not len(met):
        return "about the same", "no run met any target: nothing to compare"
    tight = met.iloc[0]
    looser = cheapest_at_targets(runs, [looser_x * tight.target_tpot_ms]).iloc[0]
    outcome = ratio_outcome(tight.usd_per_million_tokens, looser.usd_per_million_tokens, noise_rel, PRICE_CHOICES)
    numbers = (f"{tight.usd_per_million_tokens:.3g} USD/M at <= {tight.target_tpot_ms:g} ms (c={tight.concurrency:g}), "
               f"{looser.usd_per_million_tokens:.3g} at <= {looser.target_tpot_ms:g} ms (c={looser.concurrency:g})")
    if looser.concurrency > tight.concurrency and outcome == "cheaper":
        why = ("a looser target lets a bigger batch through, and the hour's price is spread over the more tokens/s it "
               "makes")
    elif looser.concurrency > tight.concurrency:
        why = "a looser target lets a bigger batch through, but here it made no cheaper token beyond the noise"
    else:
        why = "the run cheapest at the tight target is still the cheapest at the looser one: the same batch meets both"
    return outcome, f"{numbers}: {why}"
