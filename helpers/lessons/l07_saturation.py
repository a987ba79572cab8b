"""What notebook 07 (saturation) needs beyond the floors below: its conclusions from the two cap sweeps and
from the price of a token, the exercise "double the cap", and its Go deeper scale-out sections as one run.

The sweeps' conclusions (``cap_conclusion``, ``lift_conclusion``, ``goodput_conclusion``, ...) take the numbers of
``helpers.measure.saturation`` (the knee and the limit behind it) and return the sentence with its verdict;
``control_conclusion`` compares the two sweeps at concurrency 1, where the cap cannot matter, and its disagreement
is the noise the other comparisons are judged against. ``price_conclusions`` reads this machine's measured price
curve and the talk's case from the roofline (``helpers.planning.token_price``).

``lesson_replica_set`` decides where the replicas come from (the workshop's own replica set, a new set beside
a local CPU engine, or none, with the sentence that says why); ``run_scale_out`` compares the router's
policies on them (``helpers.measure.routing``) and kills one replica under load
(``helpers.measure.failover``); ``ScaleOutRun`` holds both and gives the notebook its tables, its
conclusions and the sentence that says why a section did not run.

``routing_by_policy`` and ``failure_timeline`` draw the scale-out run; the sweeps' figures are the shared ones
(``helpers.lessons.plots``). The notebook imports what it uses from here (``connect`` aside): the floors' names it
uses, and ``plots``, are re-exported in ``__all__``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from helpers.core.comparison import BETTER, SAME, SINGLE_RUN_NOISE_REL, WORSE, compare_samples
from helpers.core.models import by_profile
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, lesson_verdict, report
from helpers.core.lesson import (check_exercise, check_prediction, ratio_outcome, should_see, should_see_conclusion,
                                 show_solution)
from helpers.engine.interface import Engine, EngineError
from helpers.engine.replicas import ReplicaSet, replica_set_beside, usable_cores
from helpers.engine.router import RouterError, router_binary
from helpers.hardware.machine import check_quiet
from helpers.lessons import plots
from helpers.measure import failover, routing, saturation
from helpers.measure.bench_results import summarize, sweep_table
from helpers.measure.failover import SURVIVES, FailureRun, replica_failure_run
from helpers.measure.results_file import measure_or_load
from helpers.measure.routing import (AgentWorkload, PolicyComparison, compare_policies, conclude_affinity,
                                     conclude_later_turns, cpu_caveat, gpu_expectation)
from helpers.measure.saturation import SweepAnalysis, cap_doubling_outcome, littles_law_check, waiting_if_cap
from helpers.measure.workloads import Workload
from helpers.planning import price_curve, token_price
from helpers.planning.token_price import PRICE_CHOICES, ROOFLINE_MARGIN, looser_target_outcome

__all__ = [
    # re-exported from the floors below (and the shared figures), for the notebook
    "Workload", "check_exercise", "show_solution", "check_prediction", "check_quiet", "measure_or_load", "failover", "plots",
    "ratio_outcome", "report", "routing", "saturation", "should_see", "should_see_conclusion", "summarize",
    "sweep_table", "token_price", "price_curve",
    # this lesson's own
    "TPOT_FALL", "littles_law_check", "NOT_STARTED", "ScaleOutRun", "cap_conclusion", "cap_doubling_outcome",
    "client_lag_conclusion", "control_conclusion", "failure_timeline", "faster_is_dearer", "goodput_conclusion",
    "gpus_needed_conclusion", "knee_sentence", "lesson_replica_set", "lift_conclusion", "pareto_fold_conclusion",
    "price_conclusions", "routing_by_policy", "run_scale_out", "saturation_caveat", "saturation_conclusions",
    "slo_rule", "steadiness_conclusion", "waiting_if_cap", "TALK_PRICES", "price_gap", "price_gap_conclusions",
    "PUBLISHED_BATCHING", "batching_beside_gpu", "batching_conclusion", "by_profile", "ANSWERS", "PRICE_CHOICES",
    "looser_target_outcome", "machine_price_conclusion", "talk_price_conclusions",
]


# issue 42: what gives each core-path check's answer away; tests/test_core_path.py fails if a phrase shows above it
ANSWERS: dict[str, tuple[str, ...]] = {
    "Exercise 1: a looser latency target": ("a looser target lets a bigger batch", "a tight target caps the batch"),
    "Write it yourself: Little's law": ("L = X W", "requests per second times seconds"),
    "Exercise 2: double the small cap": ("every user beyond the cap waits",),
}


# ---------------------------------------------------------------- the two cap sweeps' conclusions

TPOT_FALL = 0.25  # median TPOT lower by this share at a higher load: the machine got faster during the sweep


def knee_sentence(analysis: SweepAnalysis, top: float) -> str:
    """The knee and its limit; without a knee, what the gauges of the most loaded run still show."""
    if analysis.knee_load is not None:
        return f"knee at concurrency {analysis.knee_load:g}, limit '{analysis.limit}'"
    return (f"no knee in throughput up to concurrency {top:g}; at {top:g} users the server's gauges read "
            f"limit '{analysis.top_limit}'")


def slo_rule(slos: dict[str, float], ttft_x: float, tpot_x: float) -> str:
    """The goodput rule in words, with the thresholds it gave on this machine."""
    return (f"goodput SLOs relative to this machine: TTFT <= {ttft_x:g}x the median at concurrency 1 = "
            f"{slos['ttft']:,.0f} ms, TPOT <= {tpot_x:g}x = {slos['tpot']:.1f} ms")


def control_conclusion(small_tok_s: float, large_tok_s: float, concurrency: int = 1) -> tuple[Conclusion, float]:
    """The two sweeps at concurrency 1, where the cap cannot matter: they should agree. Returns the sentence
    and the noise (relative difference, at least ``SINGLE_RUN_NOISE_REL``) to judge the other differences by."""
    v = compare_samples([small_tok_s], [large_tok_s])
    if v.label not in (BETTER, WORSE, SAME):
        return Conclusion(f"Control at concurrency {concurrency}: not measured in both sweeps.", WITHIN_NOISE), 1.0
    gap = abs(v.ratio - 1)
    noise = max(SINGLE_RUN_NOISE_REL, gap)
    text = (f"Control at concurrency {concurrency} (one user: the cap cannot matter): {small_tok_s:.1f} vs "
            f"{large_tok_s:.1f} output tok/s in the two sweeps, {gap:.0%} apart")
    if v.label == SAME:
        return Conclusion(text + f": the machine was steady; differences between the sweeps are judged against "
                                 f"+/-{noise:.0%}.", SHOWN), noise
    return Conclusion(text + f": the machine was noisy (something else used the CPU during one sweep); only "
                             f"differences beyond +/-{noise:.0%} count below.", NOT_SHOWN), noise


def steadiness_conclusion(summaries: Sequence[dict[str, Any]], label: str) -> Conclusion | None:
    """A sweep whose median TPOT falls as load grows (a bigger batch cannot make a step faster): the machine
    was busier during the earlier runs. None when TPOT never falls by more than ``TPOT_FALL``."""
    runs = sorted((s for s in summaries if s.get("median_tpot_ms")), key=lambda s: s["concurrency"])
    for i, early in enumerate(runs):
        later = [s for s in runs[i + 1:] if s["median_tpot_ms"] < (1 - TPOT_FALL) * early["median_tpot_ms"]]
        if later:
            low = min(later, key=lambda s: s["median_tpot_ms"])
            return Conclusion(f"{label}: median TPOT fell from {early['median_tpot_ms']:.1f} ms at concurrency "
                              f"{early['concurrency']} to {low['median_tpot_ms']:.1f} ms at {low['concurrency']}; a "
                              "bigger batch cannot make a step faster, so the machine was busier during the earlier "
                              "runs: read this sweep's curve with care.", NOT_SHOWN)
    return None


def cap_conclusion(cap: int, analysis: SweepAnalysis, top: dict[str, Any]) -> Conclusion:
    """The small cap's sweep: the lesson expects the scheduler cap to be the limit at the top load
    (``top``: the most loaded run's ``summarize`` dict)."""
    row = analysis.table.iloc[-1]
    c = top["concurrency"]
    running, waiting = (float("nan") if v is None else v for v in (row.running_max, row.waiting_max))
    text = (f"With --max-num-seqs {cap}: {knee_sentence(analysis, c)}. At {c} users at most {running:.0f} ran "
            f"and {waiting:.0f} waited; median TTFT {top['median_ttft_ms']:,.0f} ms, "
            f"{top['output_throughput']:.0f} output tokens/s")
    if analysis.top_limit == "scheduler":
        return Conclusion(text + ": requests queue behind the cap while the KV cache has room.", SHOWN)
    return Conclusion(text + f": the gauges read '{analysis.top_limit}', not the cap, so this load did not reach "
                             f"{cap} running requests with more waiting (raise the top concurrency).", NOT_SHOWN)


def lift_conclusion(cap: int, analysis: SweepAnalysis, small: dict[str, Any], large: dict[str, Any],
                    noise_rel: float) -> Conclusion:
    """The raised cap at the top load: the lesson expects more throughput and a shorter median TTFT, judged
    against ``noise_rel`` (the control's disagreement). ``small``/``large``: the top runs' summaries."""
    thr = compare_samples([small["output_throughput"]], [large["output_throughput"]], True, noise_rel)
    ttft = compare_samples([small["median_ttft_ms"]], [large["median_ttft_ms"]], False, noise_rel)
    c = large["concurrency"]
    text = (f"With --max-num-seqs {cap}: {knee_sentence(analysis, c)}. At {c} users: median TTFT "
            f"{small['median_ttft_ms']:,.0f} -> {large['median_ttft_ms']:,.0f} ms ({ttft.label}), "
            f"{small['output_throughput']:.0f} -> {large['output_throughput']:.0f} output tokens/s "
            f"({thr.ratio:.2f}x, {thr.label} at +/-{noise_rel:.0%}), median TPOT {small['median_tpot_ms']:.1f} -> "
            f"{large['median_tpot_ms']:.1f} ms")
    verdict = lesson_verdict(thr, BETTER)
    if verdict == SHOWN:
        return Conclusion(text + ": admitting more requests per step bought throughput, paid for in TPOT.", SHOWN)
    tpot_x = (large["median_tpot_ms"] / small["median_tpot_ms"]) if small.get("median_tpot_ms") else float("nan")
    if verdict == WITHIN_NOISE:
        why = f"the throughput difference is inside the +/-{noise_rel:.0%} noise"
    else:
        why = "throughput fell"
    if analysis.top_limit == "compute" or tpot_x >= thr.ratio:
        why += (f": every step got slower about as much as the batch grew (TPOT {tpot_x:.1f}x for {thr.ratio:.2f}x "
                "throughput), so compute, not the cap, is the limit now")
    return Conclusion(text + f"; {why}.", verdict)


def _missed_slos(run: dict[str, Any], slos: dict[str, float]) -> str:
    """Which SLO the run's median request missed ("median TTFT 2,738 ms"), or that only its slower ones did."""
    parts = [f"median TTFT {run['median_ttft_ms']:,.0f} ms" if run["median_ttft_ms"] > slos["ttft"] else "",
             f"median TPOT {run['median_tpot_ms']:.1f} ms" if run["median_tpot_ms"] > slos["tpot"] else ""]
    return " and ".join(p for p in parts if p) or "only its slower requests missed"


def goodput_conclusion(slos: dict[str, float], small: dict[str, Any], large: dict[str, Any],
                       caps: tuple[int, int]) -> Conclusion:
    """Goodput (requests/s within both SLOs) at the top load, small cap vs raised cap (``summarize`` dicts
    made with ``slos``): the lesson expects the raised cap to serve more requests within the SLOs."""
    g_small, g_large = small.get("request_goodput") or 0.0, large.get("request_goodput") or 0.0
    text = (f"Goodput under TTFT <= {slos['ttft']:,.0f} ms and TPOT <= {slos['tpot']:.1f} ms at {large['concurrency']} "
            f"users: {g_small:.2f} -> {g_large:.2f} requests/s ({small.get('good_requests') or 0} of {small['completed']} "
            f"vs {large.get('good_requests') or 0} of {large['completed']} requests within both)")
    if g_small == 0 and g_large == 0:
        return Conclusion(text + f": no request met both SLOs with either cap (cap {caps[0]}: {_missed_slos(small, slos)}; "
                                 f"cap {caps[1]}: {_missed_slos(large, slos)}), so this load is past what this machine "
                                 "serves within them: nothing to compare.", WITHIN_NOISE)
    v = compare_samples([g_small], [g_large], higher_is_better=True)
    verdict = lesson_verdict(v, BETTER) if g_small > 0 else (SHOWN if g_large > 0 else WITHIN_NOISE)
    if verdict == SHOWN:
        return Conclusion(text + ": fewer requests stuck in the queue past the TTFT SLO.", SHOWN)
    if verdict == WITHIN_NOISE:
        return Conclusion(text + ": no measurable difference.", WITHIN_NOISE)
    return Conclusion(text + f": the raised cap served fewer within the SLOs ({_missed_slos(large, slos)} against "
                             f"{slos['ttft']:,.0f} / {slos['tpot']:.1f} ms): with every request admitted at once, each "
                             "one waits for the whole batch's prefill and shares each step with all the others.",
                      NOT_SHOWN)


def client_lag_conclusion(top: int, lag_p99_ms: float, ttft_ms: float) -> Conclusion:
    """Whether the load generator's own event-loop lag is small next to the TTFTs it measured."""
    small = lag_p99_ms < 0.1 * ttft_ms
    return Conclusion(f"The load generator's own loop lag at {top} users: p99 {lag_p99_ms:.1f} ms "
                      f"({'small next to' if small else 'not negligible against'} the {ttft_ms:,.0f} ms median TTFT "
                      "measured).", SHOWN if small else NOT_SHOWN)


def saturation_caveat(profile: str, cores: int | None = None) -> Conclusion:
    """CPU vs GPU: on a CPU the batch shares the same few cores, so the knee comes earlier than on a GPU."""
    if profile != "cpu":
        return Conclusion("GPU: a decode step reads the weights once for the whole batch, so throughput grows with "
                          "concurrency until the scheduler cap, the KV cache or compute stops it.")
    on = f"{cores} cores" if cores else "a few cores"
    return Conclusion(f"CPU vs GPU: here every request in the batch, the server's scheduling and the load generator "
                      f"share {on}; a bigger batch soon makes each step proportionally longer, so the knee comes at a "
                      "much lower concurrency than on a GPU, where one step serves a batch of 32-128 for little more "
                      "than the cost of one sequence. The cap story is the same; the numbers are not.")


def pareto_fold_conclusion(table: pd.DataFrame, noise_rel: float = SINGLE_RUN_NOISE_REL) -> Conclusion:
    """The per-user vs total curve (a sweep table, by concurrency): adding users should move it right (more
    total tokens/s) and down (fewer per user). A run whose total falls below the run before by more than
    ``noise_rel`` folds the curve back: named, with why."""
    data = table.sort_values("concurrency")
    rows = list(data.itertuples())
    folds = [(a, b) for a, b in zip(rows, rows[1:])
             if a.output_throughput and b.output_throughput and b.output_throughput < a.output_throughput * (1 - noise_rel)]
    if not folds:
        return Conclusion(f"Adding users never cost total throughput beyond the +/-{noise_rel:.0%} noise: the curve only "
                          "moves right or stays, while each user's speed falls.", SHOWN)
    a, b = folds[0]
    return Conclusion(f"The curve folds back from concurrency {a.concurrency:g} to {b.concurrency:g}: total output "
                      f"{a.output_throughput:.0f} -> {b.output_throughput:.0f} tokens/s while each user's TPOT went "
                      f"{a.median_tpot_ms:.1f} -> {b.median_tpot_ms:.1f} ms. Past the knee a step gets slower faster than "
                      "the batch grows (on a CPU the batch, the server and the load generator share the same cores), "
                      "so more users buy less in total: the cheapest point is before the fold.", NOT_SHOWN)


def saturation_conclusions(small_results: Sequence[Any], large_results: Sequence[Any], small: SweepAnalysis,
                           large: SweepAnalysis, caps: tuple[int, int], slos: dict[str, float],
                           profile: str = "cpu", cores: int | None = None) -> list[Conclusion]:
    """Notebook 07's "what we learned", from the two sweeps' load results (lowest concurrency first) and their
    analyses: the control point, each sweep's steadiness, the small cap's limit, the raised cap against
    the control's noise, goodput under ``slos``, the client's own lag, and the CPU vs GPU caveat."""
    s_runs = [summarize(r, slos=slos) for r in small_results]
    l_runs = [summarize(r, slos=slos) for r in large_results]
    control, noise = control_conclusion(s_runs[0]["output_throughput"], l_runs[0]["output_throughput"],
                                        s_runs[0]["concurrency"])
    out = [control]
    out += [c for c in (steadiness_conclusion(s_runs, f"cap {caps[0]}"), steadiness_conclusion(l_runs, f"cap {caps[1]}"))
            if c is not None]
    out.append(cap_conclusion(caps[0], small, s_runs[-1]))
    out.append(lift_conclusion(caps[1], large, s_runs[-1], l_runs[-1], noise))
    out.append(goodput_conclusion(slos, s_runs[-1], l_runs[-1], caps))
    top = s_runs[-1]["concurrency"]
    lag = max((s.get("client_loop_lag_p99_ms") or 0.0) for s in (s_runs[-1], l_runs[-1]))
    out.append(client_lag_conclusion(top, lag, min(s_runs[-1]["median_ttft_ms"], l_runs[-1]["median_ttft_ms"])))
    out.append(saturation_caveat(profile, cores))
    return out


# ---------------------------------------------------------------- the price of a token

def faster_is_dearer(cheapest: pd.DataFrame, label: str, noise_rel: float = SINGLE_RUN_NOISE_REL) -> Conclusion:
    """Whether the tightest TPOT target this setup meets costs more per million tokens than the loosest
    (a ``cheapest_at_targets`` frame), judged against ``noise_rel``; a missed target is named."""
    met = cheapest.dropna(subset=["usd_per_million_tokens"]).sort_values("target_tpot_ms")
    missed = cheapest[cheapest["usd_per_million_tokens"].isna()]["target_tpot_ms"].tolist()
    missed_text = (f"; no setup meets {', '.join(f'{t:g}' for t in missed)} ms" if missed else "")
    if len(met) < 2:
        return Conclusion(f"{label}: fewer than two targets met{missed_text}: nothing to compare.", WITHIN_NOISE)
    tight, loose = met.iloc[0], met.iloc[-1]
    ratio = tight["usd_per_million_tokens"] / loose["usd_per_million_tokens"]
    text = (f"{label}: {tight['usd_per_million_tokens']:.3g} USD per million output tokens at TPOT <= "
            f"{tight['target_tpot_ms']:g} ms (concurrency {tight['concurrency']:g}) against "
            f"{loose['usd_per_million_tokens']:.3g} at <= {loose['target_tpot_ms']:g} ms (concurrency "
            f"{loose['concurrency']:g}){missed_text}")
    if ratio > 1 + noise_rel:
        return Conclusion(text + f": the faster token costs {ratio:.1f}x more, because a tight target caps the batch.",
                          SHOWN)
    if tight["concurrency"] == loose["concurrency"] and tight.get("setup") == loose.get("setup"):
        return Conclusion(text + ": the same setup is cheapest at both targets, so the price does not depend on the "
                                 "target in this range (the batch that meets the loose target meets the tight one "
                                 "too; try tighter targets).", NOT_SHOWN)
    return Conclusion(text + f": {ratio:.2f}x, within +/-{noise_rel:.0%}.", WITHIN_NOISE)


def gpus_needed_conclusion(table: pd.DataFrame, gpu: str, model: str, input_len: int, output_len: int) -> Conclusion:
    """How many GPUs the model needs at all on ``gpu``, and how many the cheapest setup uses per target."""
    rows = table[table["gpu"] == gpu].sort_values("target_tpot_ms")
    if rows.empty:
        return Conclusion(f"{model} does not fit on 8x {gpu}.", NOT_SHOWN)
    parts = [f"{r.target_tpot_ms:g} ms: " + ("not reachable" if math.isnan(r.usd_per_million_tokens) else
             f"{r.num_gpus:.0f} GPUs at batch {r.concurrency:.0f}, {r.usd_per_million_tokens:.3g} USD/M")
             for r in rows.itertuples()]
    return Conclusion(f"{model} on {gpu} ({input_len:,} tokens in, {output_len:,} out): the weights and one request's "
                      f"KV need at least {rows.iloc[0]['min_gpus']:.0f} GPUs; the cheapest setup per TPOT target: "
                      + "; ".join(parts) + " (roofline ceilings with ideal tensor parallelism: real prices are higher).")


def machine_price_conclusion(here: pd.DataFrame) -> Conclusion:
    """The core path's price lesson: this machine's measured curve (a ``cheapest_at_targets`` frame)."""
    return faster_is_dearer(here, "Price of a token on this machine (measured sweeps)")


def talk_price_conclusions(talk: pd.DataFrame, gpus: pd.DataFrame, talk_gpu: str, model: str, input_len: int,
                           output_len: int) -> list[Conclusion]:
    """Go deeper's price lessons: the talk's case from the roofline (how many GPUs, and faster is dearer)."""
    return [gpus_needed_conclusion(gpus, talk_gpu, model, input_len, output_len),
            faster_is_dearer(talk, f"{model} on {talk_gpu} (roofline)", ROOFLINE_MARGIN)]


def price_conclusions(here: pd.DataFrame, talk: pd.DataFrame, gpus: pd.DataFrame, talk_gpu: str, model: str,
                      input_len: int, output_len: int) -> list[Conclusion]:
    """Notebook 07's price lessons: this machine's measured curve, the talk's case from the roofline."""
    return [machine_price_conclusion(here), *talk_price_conclusions(talk, gpus, talk_gpu, model, input_len, output_len)]


# ---------------------------------------------------------------- the talk's price curve, term by term

# The talk this lesson grew from, its slide on the price of a token against latency: other vendors' selling price for
# Llama 3 70B (BF16, H100), 1K tokens in and 1K out, in USD per million tokens at a TPOT of 10, 20 and 30 ms.
TALK_PRICES = {10: 0.71, 20: 0.50, 30: 0.46}
TALK_LABEL = "the talk"
EXPLAINED_WITHIN = 0.25  # the adjusted price "explains" the talk's when within this share of it at every target


def price_gap(model: token_price.ModelOnGPU, config: Any, gpu: str, num_gpus: int, input_len: int, output_len: int,
              targets_ms: Sequence[float] = tuple(TALK_PRICES)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(prices, attribution): the ideal and term-by-term prices at ``targets_ms`` and the talk's targets on ``num_gpus``
    of ``gpu`` at the facts table's hourly price, and each term's share of the gap to ``TALK_PRICES``
    (price_curve.REAL_STEP, fixed before any curve is drawn)."""
    from helpers.hardware.gpus import get_gpu, hourly_price

    one, shape = get_gpu(gpu), price_curve.shape_of(model, config)
    limit = token_price.max_batch(one, num_gpus, model, input_len + output_len)
    if limit < 1:
        raise ValueError(f"{model.name} and one request's KV do not fit on {num_gpus}x {gpu}: raise TALK_NUM_GPUS")
    targets = sorted(set(targets_ms) | set(TALK_PRICES))  # the talk's targets always, to compare with
    prices = price_curve.term_prices(one, num_gpus, shape, limit, hourly_price(gpu).usd_per_hour * num_gpus,
                                     input_len, output_len, targets)
    return prices, price_curve.term_attribution(prices, TALK_PRICES)


def price_gap_conclusions(attribution: pd.DataFrame) -> list[Conclusion]:
    """``price_curve.gap_conclusions`` against ``TALK_PRICES``: steeper than the ideal, each term's share, explained."""
    return price_curve.gap_conclusions(attribution, TALK_LABEL, EXPLAINED_WITHIN, ROOFLINE_MARGIN)


# ---------------------------------------------------------------- batching on a GPU, beside this CPU's

# One published GPU measurement, NOT from this run: vLLM RFC #6913 "Asynchronous Output Processor" (2024-07-29),
# Llama 3 70B Instruct in FP8 (dynamic scaling) on 4x H100, 128 input tokens: TPOT 19 ms at batch 1, 25 ms at batch 32.
PUBLISHED_BATCHING = {"source": "github.com/vllm-project/vllm/issues/6913 (2024-07-29)", "num_gpus": 4,
                      "model": "Llama-3.3-70B", "dtype": "fp8", "context": 128, "batches": (1, 32),
                      "tpot_ms": (19.0, 25.0), "what": "Llama 3 70B FP8 on 4x H100, vLLM"}


def batching_beside_gpu(table: pd.DataFrame, gpu: str) -> pd.DataFrame:
    """Batching's gain three ways: this run's sweep (concurrency 1 against the top), the roofline of the published
    case on 4x ``gpu``, and the published measurement (not from this run): batches, TPOTs, throughput gain."""
    run = table.dropna(subset=["median_tpot_ms", "output_throughput"]).sort_values("concurrency")
    lo, hi = run.iloc[0], run.iloc[-1]
    pub = PUBLISHED_BATCHING
    model = token_price.model_on_gpu(pub["model"], token_price.reference_config(pub["model"]), pub["dtype"])
    roof = [token_price.group_tpot_ms(gpu, pub["num_gpus"], model, b, pub["context"], pub["dtype"]) for b in pub["batches"]]

    def row(label: str, batches: Sequence[float], tpots: Sequence[float], gain: float | None = None) -> dict:
        gain = gain if gain is not None else (batches[1] / tpots[1]) / (batches[0] / tpots[0])
        return {"setup": label, "batch_low": batches[0], "batch_high": batches[1], "tpot_low_ms": tpots[0],
                "tpot_high_ms": tpots[1], "throughput_gain": gain}

    return pd.DataFrame([
        row("this machine (measured in this run)", (lo.concurrency, hi.concurrency), (lo.median_tpot_ms, hi.median_tpot_ms),
            hi.output_throughput / lo.output_throughput),
        row(f"roofline: {pub['what'].split(', ')[0].replace('H100', gpu)}", pub["batches"], roof),
        row(f"published, not from this run: {pub['what']} ({pub['source']})", pub["batches"], pub["tpot_ms"]),
    ])


def batching_conclusion(frame: pd.DataFrame) -> Conclusion:
    """This machine's batching gain beside the GPU's roofline and the published measurement."""
    here, roof, pub = frame.to_dict("records")
    return Conclusion(f"Batching: here {here['batch_high'] / here['batch_low']:.0f}x the users bought "
                      f"{here['throughput_gain']:.1f}x the output tokens/s (TPOT {here['tpot_low_ms']:.0f} -> "
                      f"{here['tpot_high_ms']:.0f} ms); on a GPU the roofline predicts {roof['throughput_gain']:.0f}x for "
                      f"{roof['batch_high'] / roof['batch_low']:.0f}x the batch (TPOT {roof['tpot_low_ms']:.1f} -> "
                      f"{roof['tpot_high_ms']:.1f} ms), and a published vLLM measurement (not from this run) shows "
                      f"{pub['throughput_gain']:.0f}x (TPOT {pub['tpot_low_ms']:.0f} -> {pub['tpot_high_ms']:.0f} ms): a "
                      "GPU step reads the weights once for the whole batch, a CPU's few cores compute each sequence.")


# ---------------------------------------------------------------- beyond one engine: replicas behind the router

def lesson_replica_set(engine: Engine, replicas: int = 2) -> tuple[ReplicaSet | None, bool, str]:
    """Where a notebook's scale-out lesson gets its replicas: ``(replica_set, start_it, why_not)``.

    The workshop's engine itself when it is a replica set (``workshop up --replicas N``: used as it is);
    a new set beside a local CPU engine (the notebook starts and stops it); otherwise None and one sentence
    saying why the lesson cannot start replicas from here and where it would run."""
    if isinstance(engine, ReplicaSet):
        return engine, False, ""
    settings = engine.settings
    if settings.profile == "k8s":
        return None, False, ("The engine runs in a cluster: there, replicas and the router are the instructor's "
                             "kustomize component k8s/components/router (an engine Deployment with N replicas, the "
                             "router finding them by label). This section starts replicas on the local CPU profile.")
    if not settings.managed:
        return None, False, (f"The endpoint {settings.base_url} is external (VLLM_HOST is set): replicas start only "
                             "where the workshop starts its own engine. Without VLLM_HOST, `workshop up --replicas "
                             f"{replicas}` runs them on this machine.")
    if settings.profile != "cpu":
        return None, False, (f"On the {settings.profile} profile the workshop's engine already holds the GPU's memory, "
                             f"so replicas beside it would not fit: `workshop down`, then `workshop up --replicas "
                             f"{replicas}` (one GPU per replica) and run this notebook again.")
    try:
        router_binary()
    except RouterError as err:
        return None, False, f"{err} This section is skipped until it is installed."
    return replica_set_beside(settings, replicas), True, ""


NOT_STARTED = ("Replicas not started: RUN_GO_DEEPER is False (each replica is an engine of its own, on a GPU a GPU of "
               "its own; on a cluster the instructor's kustomize component k8s/components/router runs them).")


@dataclass
class ScaleOutRun:
    """The routing comparison and the failure run of notebook 07, or the sentence that says why they did not run."""

    comparison: PolicyComparison | None = None
    failure: FailureRun | None = None
    skipped: str = ""
    n_replicas: int = 0
    cores: int = 0
    worker_urls: list[str] = field(default_factory=list)  # the replicas, as the router knows them

    def summary(self) -> pd.DataFrame:
        """Per policy: hit rate (mean, min, max over repeats), TTFT turn 1 and later turns (ms), throughput."""
        return self.comparison.summary() if self.comparison is not None else pd.DataFrame()

    def affinity(self) -> Conclusion:
        """Session affinity against round robin on the replicas' prefix-cache hit rate."""
        if self.comparison is None:
            return Conclusion(self.skipped, WITHIN_NOISE, "session affinity keeps more of each conversation in cache")
        return conclude_affinity(self.comparison.samples("hit_rate"))

    def later_turns(self) -> Conclusion:
        """TTFT of turns 2+ with session affinity against round robin."""
        if self.comparison is None:
            return Conclusion(self.skipped, WITHIN_NOISE, "later turns start sooner with session affinity")
        return conclude_later_turns(self.comparison.samples("ttft_later_s"))

    def caveats(self) -> list[str]:
        """Why throughput cannot grow with replicas on this CPU, and the GPU expectation (an estimate)."""
        if self.comparison is None:
            return []
        return [cpu_caveat(self.n_replicas, self.cores), gpu_expectation(self.n_replicas)]

    def survival(self) -> Conclusion:
        """``SURVIVAL_RULE`` applied to the failure run."""
        if self.failure is None:
            return Conclusion(self.skipped or "no failure run", WITHIN_NOISE, SURVIVES)
        return self.failure.survival()

    def failure_story(self) -> str:
        """When the replica was killed, how long its restart and its return to the rotation took, what the router counted."""
        if self.failure is None:
            return self.skipped or "No failure run."
        return self.failure.story(self.worker_urls)

    def failure_table(self) -> pd.DataFrame:
        """The failure run's requests by phase (before the kill, detection window, after) and outcome."""
        return self.failure.table() if self.failure is not None else pd.DataFrame()

    def conclusions(self) -> list[Conclusion | str]:
        """Everything the two sections concluded, for the notebook's summary."""
        if self.comparison is None:
            return [Conclusion(f"Replicas behind a router: not run here. {self.skipped}")]
        return [*self.policy_lines(), self.affinity(), self.later_turns(), *map(Conclusion, self.caveats()),
                self.survival()]

    def policy_lines(self) -> list[Conclusion]:
        """One plain line per policy: hit rate (range over repeats), TTFT of turn 1 and later turns, throughput."""
        lines = []
        for row in self.summary().itertuples():
            spread = f" (runs {row.hit_rate_min:.1%}-{row.hit_rate_max:.1%})" if row.repeats > 1 else ""
            lines.append(Conclusion(f"{row.policy} over {self.n_replicas} replicas: prefix-cache hit rate "
                                    f"{row.hit_rate:.1%}{spread}, TTFT turn 1 {row.ttft_turn1_ms:,.0f} ms, later turns "
                                    f"{row.ttft_later_ms:,.0f} ms, {row.throughput_tok_s:,.1f} output tok/s, "
                                    f"{row.failed} failed"))
        return lines


def run_scale_out(lab: Any, replicas: int, policies: tuple[str, ...] | list[str], workload: AgentWorkload,
                  repeats: int = 1, failure_workload: AgentWorkload | None = None, kill_after_completed: int = 4,
                  restart: bool = True, progress: bool | None = None) -> ScaleOutRun:
    """Notebook 07's scale-out run: replicas behind the router (the workshop's own replica set, or ``replicas``
    started beside its engine and stopped after), the policies compared on ``workload``, then one replica
    killed under ``failure_workload`` (None: no failure run). Where replicas cannot run, nothing starts and
    ``skipped`` says why; a set that fails to start is stopped and reported the same way."""
    engine, start_it, why = lesson_replica_set(lab.engine, replicas)
    if engine is None:
        return ScaleOutRun(skipped=why)
    result = ScaleOutRun(n_replicas=engine.n, cores=len(usable_cores()), worker_urls=engine.worker_urls())
    try:
        if start_it:
            if progress is not False:
                print(f"starting {engine.n} replicas (ports {', '.join(map(str, engine.ports))}) and the router "
                      f"(port {engine.settings.port}) beside the workshop's engine ...", flush=True)
            engine.start()
        result.comparison = compare_policies(engine, tuple(policies), workload, repeats=repeats, progress=progress)
        if failure_workload is not None:
            result.failure = replica_failure_run(engine, workload=failure_workload, restart=restart, progress=progress,
                                                 kill_after_completed=kill_after_completed)
    except (EngineError, RouterError) as err:
        result.skipped = f"The replica set failed: {getattr(err, 'message', str(err))}"
    finally:
        if start_it:
            engine.stop()
    return result


# ---------------------------------------------------------------- the scale-out run's figures

def routing_by_policy(run: ScaleOutRun) -> Figure | None:
    """Left: each replica's prefix-cache hit rate per router policy (bars, summed over repeats, labelled with the
    requests it served), the total as a black tick. Right: mean TTFT per turn (ms) per policy. None when the comparison did not run."""
    if run.comparison is None:
        return None
    per_replica = run.comparison.per_replica()
    policies = list(dict.fromkeys(per_replica["policy"]))
    replicas = sorted(set(per_replica["replica"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.9), constrained_layout=True)
    width = 0.8 / max(1, len(replicas))
    for j, replica in enumerate(replicas):
        rows = per_replica[per_replica["replica"] == replica].set_index("policy").reindex(policies)
        bars = left.bar([i - 0.4 + width * (j + 0.5) for i in range(len(policies))], rows["hit_rate"].fillna(0), width,
                        label=f"replica {replica}")
        left.bar_label(bars, [f"{int(n)} req" for n in rows["requests"].fillna(0)], fontsize=7, padding=2)
    totals = per_replica.groupby("policy", sort=False)[["prefix_hits", "prefix_queries"]].sum().reindex(policies)
    left.scatter(range(len(policies)), totals["prefix_hits"] / totals["prefix_queries"], marker="_", s=900,
                 color="black", zorder=3, label="all replicas")
    left.set_xticks(range(len(policies)), policies)
    left.set_ylim(0, 1.12)
    left.set_ylabel("prefix-cache hit rate (hits / queried tokens)")
    left.set_title("Where the cache hits land")
    left.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    turns = run.comparison.ttft_per_turn()
    for policy, row in turns.iterrows():
        right.plot(list(row.index), list(row.values), marker="o", label=str(policy))
    right.set_xticks(list(turns.columns))
    _axes_outside_legend(right, "turn of the conversation", "mean TTFT (ms)", "TTFT per turn")
    return fig


def _axes_outside_legend(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Axis labels and title, y from zero, the legend outside the data on the right."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)


def failure_timeline(run: ScaleOutRun) -> Figure | None:
    """Every request of the failure run at its send time (s) against its end-to-end latency (s): completed and
    failed apart, the kill and the detection window marked. None when no failure run took place."""
    failure = run.failure
    if failure is None or failure.requests.empty:
        return None
    frame = failure.requests
    fig, ax = plt.subplots(figsize=(9, 3.6), constrained_layout=True)
    ok = frame["ok"].astype(bool)
    ax.scatter(frame[ok]["t_start"], frame[ok]["e2e_s"], s=18, color="tab:green", label="completed")
    ax.scatter(frame[~ok]["t_start"], frame[~ok]["e2e_s"], s=40, marker="x", color="tab:red",
               label="failed (the client saw an error)")
    if failure.t_kill_s is not None:
        ax.axvline(failure.t_kill_s, color="black", linestyle="--", label=f"replica {failure.killed_replica} killed")
        ax.axvspan(failure.t_kill_s, failure.t_kill_s + failure.detect_s, color="tab:orange", alpha=0.15,
                   label=f"detection window ({failure.detect_s:g} s)")
    _axes_outside_legend(ax, "request sent, s since the run started", "end-to-end latency (s)",
                         "What the client saw while a replica died")
    return fig
