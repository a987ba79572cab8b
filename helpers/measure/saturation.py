"""Where a sweep stops scaling, and what limits it there.

``find_knee``: the last load level worth having: the next one adds less than ``min_gain`` (10 %) output
throughput per doubling of load while the median TTFT grows by ``ttft_growth`` (2x) or more. The gain is
taken per doubling because sweeps step unevenly (1, 8, 32): +15 % from 8 to 32 users is two doublings
at +7 % each, a flat curve plus noise, not growth.

``classify_limit``: reads the server's gauges sampled during one run (helpers/measure/server_metrics.py):
- ``memory``: the KV cache is (nearly) full and requests are preempted or kept waiting: the batch is
  as large as the KV cache allows (more KV memory, shorter contexts, FP8 KV, or fewer users help);
- ``scheduler``: requests wait while the running count sits at ``--max-num-seqs`` and the KV cache has
  room: the scheduler cap, not the hardware, is the limit (raise max-num-seqs);
- ``compute``: neither: everything admitted runs, and each engine step just takes longer with the
  batch (compute or memory bandwidth; a faster GPU, quantization or a smaller model help).
``--max-num-seqs`` is not in /metrics: pass it when known; otherwise the highest running count seen in
the sweep stands for it (and the verdict says it was inferred).

The conclusions of notebook 07 (``cap_conclusion``, ``lift_conclusion``, ``goodput_conclusion``, ...) take the
sweeps' numbers and return the sentence with its verdict; ``control_conclusion`` compares the two sweeps at
concurrency 1, where the cap cannot matter, and its disagreement is the noise the other comparisons are
judged against. ``relative_slos`` sets goodput SLOs as multiples of this machine's concurrency-1 latencies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from helpers.core.comparison import BETTER, SAME, SINGLE_RUN_NOISE_REL, WORSE, compare_samples
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, lesson_verdict

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

KV_FULL = 0.90  # KV usage (fraction) counted as full
WAITING_SHARE = 0.20  # share of samples with requests waiting that counts as "requests wait"
AT_CAP_SHARE = 0.80  # share of those samples with running at the cap that counts as "held at the cap"


@dataclass
class LimitVerdict:
    """What limited one run: ``limit`` is scheduler, memory, compute or unknown; ``reason`` says why."""

    limit: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


def find_knee(load: Sequence[float], throughput: Sequence[float], ttft_p50: Sequence[float],
              min_gain: float = 0.10, ttft_growth: float = 2.0) -> int | None:
    """Index of the last run before throughput stops growing (< min_gain per doubling of load) while TTFT p50
    grows >= ttft_growth x.

    ``load`` must be increasing; None when the sweep never saturates.
    """
    if not (len(load) == len(throughput) == len(ttft_p50)):
        raise ValueError("load, throughput and ttft_p50 need one value per run")
    if any(b <= a for a, b in zip(load, load[1:])):
        raise ValueError("sort the runs by increasing load first")
    for i in range(len(load) - 1):
        thr, thr_next, ttft, ttft_next = throughput[i], throughput[i + 1], ttft_p50[i], ttft_p50[i + 1]
        if thr is None or thr_next is None or ttft is None or ttft_next is None or not thr > 0 or not ttft > 0:
            continue
        doublings = np.log2(load[i + 1] / load[i])
        gain_per_doubling = (thr_next / thr) ** (1 / doublings) - 1 if thr_next > 0 else -1.0
        if gain_per_doubling < min_gain and ttft_next / ttft >= ttft_growth:
            return i
    return None


def classify_limit(gauges: pd.DataFrame | None, max_num_seqs: int | None = None, kv_full: float = KV_FULL,
                   waiting_share: float = WAITING_SHARE, at_cap_share: float = AT_CAP_SHARE,
                   max_num_seqs_inferred: bool | None = None) -> LimitVerdict:
    """Scheduler cap, KV memory or compute, from the gauges sampled during one run (see module doc).

    Without ``max_num_seqs`` the run's highest running count stands in for it;
    ``max_num_seqs_inferred`` marks a cap that was itself guessed (a sweep's highest running count).
    """
    if gauges is None or len(gauges) == 0:
        return LimitVerdict("unknown", "no server gauges were sampled during this run")
    running = gauges.get("num_requests_running", pd.Series(dtype=float)).astype(float)
    waiting = gauges.get("num_requests_waiting", pd.Series(dtype=float)).astype(float)
    kv = gauges.get("kv_cache_usage", pd.Series(dtype=float)).astype(float)
    preempt = gauges.get("num_preemptions", pd.Series(dtype=float)).astype(float).dropna()
    if running.dropna().empty or waiting.dropna().empty:
        return LimitVerdict("unknown", "the server exposes no running/waiting gauges")
    kv_max = float(kv.max()) if kv.notna().any() else None
    preemptions = float(preempt.iloc[-1] - preempt.iloc[0]) if len(preempt) >= 2 else 0.0
    waits = waiting > 0
    share_waiting = float(waits.mean())
    inferred = max_num_seqs is None if max_num_seqs_inferred is None else max_num_seqs_inferred
    cap = float(running.max()) if max_num_seqs is None else float(max_num_seqs)
    at_cap = (running[waits] >= cap).mean() if waits.any() else 0.0
    evidence = {"kv_cache_usage_max": kv_max, "preemptions": preemptions, "waiting_share": share_waiting,
                "waiting_max": float(waiting.max()), "running_max": float(running.max()),
                "running_at_cap_share": float(at_cap), "max_num_seqs": cap, "max_num_seqs_inferred": inferred}
    if kv_max is not None and kv_max >= kv_full and (preemptions > 0 or share_waiting >= waiting_share):
        return LimitVerdict("memory", f"KV cache {kv_max:.0%} full with {preemptions:.0f} preemptions and requests "
                                      f"waiting in {share_waiting:.0%} of samples: the KV cache caps the batch",
                            evidence)
    # Requests wait while the KV cache has room: the scheduler holds them. Running is often sampled below
    # the cap between a cohort finishing and the next being admitted (closed-loop users of equal length
    # finish together), so reaching the cap at all counts, not only staying at it.
    if share_waiting >= waiting_share and (at_cap >= at_cap_share or float(running.max()) >= cap):
        how = "the most seen running (max-num-seqs inferred)" if inferred else "max-num-seqs"
        kv_text = "unknown" if kv_max is None else f"at most {kv_max:.0%}"
        return LimitVerdict("scheduler", f"up to {waiting.max():.0f} requests waiting while running stayed at "
                                         f"{cap:.0f} = {how}, KV cache {kv_text} used: the scheduler cap is the limit",
                            evidence)
    kv_text = "unknown" if kv_max is None else f"{kv_max:.0%}"
    return LimitVerdict("compute", f"requests hardly wait ({share_waiting:.0%} of samples) and the KV cache peaks at "
                                   f"{kv_text}: every admitted request runs, the engine steps are what slow down",
                        evidence)


@dataclass
class SweepAnalysis:
    """The knee of a sweep and the limit behind it, with the per-run table it was read from."""

    table: pd.DataFrame  # one row per run: load, throughput, latencies, verdict
    knee_index: int | None
    knee_load: float | None
    limit: str | None  # None when the sweep never saturates
    reason: str
    top_limit: str = "unknown"  # what the server showed in the most loaded run, knee or not


def load_axis(summaries: Sequence[dict[str, Any]]) -> tuple[str, list[float]]:
    """The x of a sweep: ("concurrency", ...) for closed loops, ("request_rate", ...) for open loops."""
    if all(s.get("mode", "concurrency") == "concurrency" for s in summaries):
        return "concurrency", [float(s.get("concurrency") or s.get("max_concurrency")) for s in summaries]
    return "request_rate", [float(s["request_rate"]) for s in summaries]


def analyze_sweep(summaries: Sequence[dict[str, Any]], gauges: Sequence[pd.DataFrame | None] | None = None,
                  max_num_seqs: int | None = None, min_gain: float = 0.10, ttft_growth: float = 2.0) -> SweepAnalysis:
    """Knee and limit of a sweep from its summaries (helpers.measure.bench_results.summarize) and sampled gauges."""
    if not summaries:
        raise ValueError("an empty sweep has no knee")
    gauges = list(gauges) if gauges is not None else [None] * len(summaries)
    if len(gauges) != len(summaries):
        raise ValueError("give one gauge frame (or None) per run")
    axis, x = load_axis(summaries)
    order = np.argsort(x)
    summaries = [summaries[i] for i in order]
    gauges = [gauges[i] for i in order]
    x = [x[i] for i in order]
    if max_num_seqs is None:  # the cap seen across the whole sweep, not per run
        seen = [float(g["num_requests_running"].max()) for g in gauges
                if g is not None and "num_requests_running" in g and g["num_requests_running"].notna().any()]
        cap = int(max(seen)) if seen else None
    else:
        cap = max_num_seqs
    verdicts = [classify_limit(g, cap, max_num_seqs_inferred=max_num_seqs is None) for g in gauges]
    throughput = [s.get("output_throughput") for s in summaries]
    ttft = [s.get("median_ttft_ms") for s in summaries]
    knee = find_knee(x, throughput, ttft, min_gain, ttft_growth)
    table = pd.DataFrame({
        axis: x, "output_throughput": throughput,
        "request_throughput": [s.get("request_throughput") for s in summaries],
        "median_ttft_ms": ttft, "p99_ttft_ms": [s.get("p99_ttft_ms") for s in summaries],
        "median_tpot_ms": [s.get("median_tpot_ms") for s in summaries],
        "limit": [v.limit for v in verdicts],
        "kv_cache_usage_max": [v.evidence.get("kv_cache_usage_max") for v in verdicts],
        "waiting_max": [v.evidence.get("waiting_max") for v in verdicts],
        "running_max": [v.evidence.get("running_max") for v in verdicts],
        "preemptions": [v.evidence.get("preemptions") for v in verdicts],
    })
    # The most loaded run shows the limit most clearly. Its gauges are read even without a knee: requests
    # queued at the cap are a fact of that run, while a knee rests on throughput differences that a short
    # run on a busy machine can blur.
    verdict = verdicts[-1]
    if knee is None:
        reason = ("throughput still grows (or TTFT stays flat) across the sweep: not saturated; extend it to "
                  f"higher load. At {axis} {x[-1]:g} the server shows: {verdict.reason}")
        return SweepAnalysis(table, None, None, None, reason, verdict.limit)
    reason = f"throughput stops growing after {axis} {x[knee]:g}; at {axis} {x[-1]:g}: {verdict.reason}"
    return SweepAnalysis(table, knee, x[knee], verdict.limit, reason, verdict.limit)


def analyze_results(results: Sequence[Any], max_num_seqs: int | None = None, **kwargs: Any) -> SweepAnalysis:
    """``analyze_sweep`` straight from load results (helpers.measure.loadgen.LoadResult with their gauges)."""
    from helpers.measure.bench_results import summarize

    return analyze_sweep([summarize(r) for r in results], [r.gauges for r in results], max_num_seqs, **kwargs)


# ---------------------------------------------------------------- conclusions (notebook 07)

TPOT_FALL = 0.25  # median TPOT lower by this share at a higher load: the machine got faster during the sweep


def knee_sentence(analysis: SweepAnalysis, top: float) -> str:
    """The knee and its limit; without a knee, what the gauges of the most loaded run still show."""
    if analysis.knee_load is not None:
        return f"knee at concurrency {analysis.knee_load:g}, limit '{analysis.limit}'"
    return (f"no knee in throughput up to concurrency {top:g}; at {top:g} users the server's gauges read "
            f"limit '{analysis.top_limit}'")


def relative_slos(c1: dict[str, Any], ttft_x: float, tpot_x: float) -> dict[str, float]:
    """Goodput SLOs (ms) as multiples of this machine's unloaded latencies: ``ttft_x`` times the median TTFT
    and ``tpot_x`` times the median TPOT of the concurrency-1 run (a ``summarize`` dict)."""
    ttft, tpot = c1.get("median_ttft_ms"), c1.get("median_tpot_ms")
    if not ttft or not tpot:
        raise ValueError("the concurrency-1 run has no TTFT/TPOT; run the sweep from concurrency 1 first")
    return {"ttft": round(ttft_x * ttft, 1), "tpot": round(tpot_x * tpot, 2)}


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


def run_cap_sweep(lab: Lab, cap: int | None, concurrencies: Sequence[int], workload: Any, requests_per_user: int = 2,
                  min_requests: int = 8, sample_interval_s: float = 0.25) -> tuple[list[Any], SweepAnalysis]:
    """Restart on ``--max-num-seqs cap``, run one closed-loop load per concurrency with the server's gauges
    sampled (a bar counts the concurrencies, beside each run's bar of requests), and analyze the sweep.
    Returns the load results and the analysis. The engine goes back to the flag it started with, in a
    ``finally``: a sweep stopped midway does not leave it on the cap."""
    from helpers.measure.loadgen import run_sweep
    from helpers.measure.workloads import Load
    from helpers.core.progress import steps
    from helpers.core.vllm_args import flag_value

    start = flag_value(lab.engine.args(), "--max-num-seqs")
    lab.engine.set_flag("--max-num-seqs", cap)
    results: list[Any] = []
    try:
        for c in steps(concurrencies, f"--max-num-seqs {cap} sweep", "run", label=lambda c: f"concurrency {c}"):
            load = Load(num_requests=max(min_requests, requests_per_user * c), warmup_requests=min(c, 4))
            results += run_sweep(lab.settings, workload, concurrencies=[c], load=load, metrics=True,
                                 sample_interval_s=sample_interval_s)
    finally:
        if flag_value(lab.engine.args(), "--max-num-seqs") != start:
            lab.engine.set_flag("--max-num-seqs", start)  # None removes the flag again
    return results, analyze_results(results, max_num_seqs=cap)


def saturation_conclusions(small_results: Sequence[Any], large_results: Sequence[Any], small: SweepAnalysis,
                           large: SweepAnalysis, caps: tuple[int, int], slos: dict[str, float],
                           profile: str = "cpu", cores: int | None = None) -> list[Conclusion]:
    """Notebook 07's "what we learned", from the two sweeps' load results (lowest concurrency first) and their
    analyses: the control point, each sweep's steadiness, the small cap's limit, the raised cap against
    the control's noise, goodput under ``slos``, the client's own lag, and the CPU vs GPU caveat."""
    from helpers.measure.bench_results import summarize

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


def waiting_if_cap(users: int, cap: int) -> int:
    """Requests waiting in a closed loop of ``users`` back-to-back users behind ``--max-num-seqs cap``."""
    return max(0, int(users) - int(cap))


def cap_doubling_outcome(users: int, cap: int, waited_max: float) -> tuple[str, str]:
    """The exercise "double the cap": ("none would wait" | "fewer would wait" | "as many would wait") and the
    numbers, from the closed-loop queue (users - cap) against the most requests seen waiting at ``cap``."""
    now, doubled = waiting_if_cap(users, cap), waiting_if_cap(users, 2 * cap)
    outcome = "none would wait" if doubled == 0 else "fewer would wait" if doubled < now else "as many would wait"
    return outcome, (f"{users} users behind a cap of {cap}: {now} wait (the gauges saw at most {waited_max:.0f}); behind "
                     f"{2 * cap}: {doubled} would wait")


def compare_at_top(top: int, sweeps: dict[str, tuple[pd.DataFrame, SweepAnalysis]]) -> pd.DataFrame:
    """The sweeps side by side at concurrency ``top``: label -> (its sweep table, its analysis)."""
    rows = {}
    for label, (table, analysis) in sweeps.items():
        run = table.loc[table.concurrency == top].iloc[0]
        gauges = analysis.table.loc[analysis.table.concurrency == top].iloc[0]
        rows[label] = {"output tokens/s": run.output_throughput, "median TTFT ms": run.median_ttft_ms,
                       "p99 TTFT ms": run.p99_ttft_ms, "median TPOT ms": run.median_tpot_ms,
                       "goodput req/s": run.get("request_goodput"), "waiting (max)": gauges.waiting_max,
                       "running (max)": gauges.running_max}
    return pd.DataFrame(rows)


def client_lag_table(results_by_cap: dict[int, Sequence[Any]]) -> pd.DataFrame:
    """The load generator's own event-loop lag (ms) and in-flight requests, per cap and concurrency."""
    from helpers.measure.bench_results import summarize

    rows = []
    for cap, results in results_by_cap.items():
        for r in results:
            s = summarize(r)
            rows.append({"cap": cap, "concurrency": r.load.concurrency, "client_loop_lag_p99_ms": s["client_loop_lag_p99_ms"],
                         "client_loop_lag_max_ms": s["client_loop_lag_max_ms"], "client_max_inflight": s["client_max_inflight"]})
    return pd.DataFrame(rows)
