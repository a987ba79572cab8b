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

``relative_slos`` sets goodput SLOs as multiples of this machine's concurrency-1 latencies; ``run_cap_sweep`` runs
one sweep at a ``--max-num-seqs`` cap. Notebook 07's sentences about the sweeps live in its lesson module
(helpers/lessons/l07_saturation.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

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


# ---------------------------------------------------------------- notebook 07's sweeps: SLOs, the cap sweep, tables

def relative_slos(c1: dict[str, Any], ttft_x: float, tpot_x: float) -> dict[str, float]:
    """Goodput SLOs (ms) as multiples of this machine's unloaded latencies: ``ttft_x`` times the median TTFT
    and ``tpot_x`` times the median TPOT of the concurrency-1 run (a ``summarize`` dict)."""
    ttft, tpot = c1.get("median_ttft_ms"), c1.get("median_tpot_ms")
    if not ttft or not tpot:
        raise ValueError("the concurrency-1 run has no TTFT/TPOT; run the sweep from concurrency 1 first")
    return {"ttft": round(ttft_x * ttft, 1), "tpot": round(tpot_x * tpot, 2)}


START = object()  # run_cap_sweep's restore_to: the value the engine had when the sweep started


def current_cap(lab: Lab) -> str | None:
    """The engine's ``--max-num-seqs`` now (None: vLLM's default), to put it back on after sweeps."""
    from helpers.core.vllm_args import flag_value

    value = flag_value(lab.engine.args(), "--max-num-seqs")
    return None if value is None or isinstance(value, bool) else value


def run_cap_sweep(lab: Lab, cap: int | None, concurrencies: Sequence[int], workload: Any, requests_per_user: int = 2,
                  min_requests: int = 8, sample_interval_s: float = 0.25, restore: bool = True,
                  restore_to: str | None | object = START) -> tuple[list[Any], SweepAnalysis]:
    """Restart on ``--max-num-seqs cap``, run one closed-loop load per concurrency with the server's gauges
    sampled (a bar counts the concurrencies, beside each run's bar of requests), and analyze the sweep.
    Returns the load results and the analysis. The engine goes back to the flag it started with, in a
    ``finally``: a sweep stopped midway does not leave it on the cap. ``restore=False`` leaves it on the cap
    after a sweep that finished, for a next sweep that sets its own (one restart fewer: on a GPU each is a
    minute or more); a sweep stopped midway still puts it back. That next sweep is given the first one's
    starting value (``current_cap`` before the first) as ``restore_to``, so it goes back there, not to the
    first sweep's cap."""
    from helpers.measure.loadgen import run_sweep
    from helpers.measure.workloads import Load
    from helpers.core.progress import steps
    from helpers.core.vllm_args import flag_value

    start = current_cap(lab) if restore_to is START else restore_to
    lab.engine.set_flag("--max-num-seqs", cap)
    results: list[Any] = []
    finished = False
    try:
        for c in steps(concurrencies, f"--max-num-seqs {cap} sweep", "run", label=lambda c: f"concurrency {c}"):
            load = Load(num_requests=max(min_requests, requests_per_user * c), warmup_requests=min(c, 4))
            results += run_sweep(lab.settings, workload, concurrencies=[c], load=load, metrics=True,
                                 sample_interval_s=sample_interval_s)
        finished = True
    finally:
        if (restore or not finished) and flag_value(lab.engine.args(), "--max-num-seqs") != start:
            lab.engine.set_flag("--max-num-seqs", start)  # None removes the flag again
    return results, analyze_results(results, max_num_seqs=cap)


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


# ---------------------------------------------------------------- Little's law, checked (notebook 07's exercise)

def littles_law_check(throughput_req_s: float, latency_s: float, users: int):
    """A ``check_exercise`` check of the requests in flight by Little's law, L = throughput (req/s) x latency (s): None
    when the answer is that product, else the sentence that says what is wrong (divided, inverted, the concurrency)."""
    slips = [(throughput_req_s / latency_s if latency_s else None,
              "that divides throughput by latency: requests in flight are the two multiplied."),
             (latency_s / throughput_req_s if throughput_req_s else None,
              "that divides latency by throughput: requests in flight are the two multiplied."),
             (users, f"{users} is the concurrency the load generator was set to; compute the requests in flight from "
                     "the measured throughput and latency, and compare.")]

    def check(answer: Any) -> str | None:
        try:
            value = float(answer)
        except (TypeError, ValueError):
            return f"the answer must be a number of requests, not {answer!r}."
        if math.isclose(value, throughput_req_s * latency_s, rel_tol=1e-6, abs_tol=1e-6):
            return None
        why = [w for target, w in slips if target is not None and math.isclose(value, target, rel_tol=1e-6, abs_tol=1e-6)]
        return why[0] if why else f"{value:.4g} is not throughput_req_s x latency_s."
    return check


# ---------------------------------------------------------------- notebook 07's exercise: double the cap

def waiting_if_cap(users: int, cap: int) -> int:
    """Requests waiting in a closed loop of ``users`` back-to-back users behind ``--max-num-seqs cap``."""
    return max(0, int(users) - int(cap))


def cap_doubling_outcome(users: int, cap: int, waited_max: float) -> tuple[str, str]:
    """The exercise "double the cap": ("none would wait" | "fewer would wait" | "as many would wait") and the
    numbers, from the closed-loop queue (users - cap) against the most requests seen waiting at ``cap``."""
    now, doubled = waiting_if_cap(users, cap), waiting_if_cap(users, 2 * cap)
    outcome = "none would wait" if doubled == 0 else "fewer would wait" if doubled < now else "as many would wait"
    return outcome, (f"in a closed loop every user beyond the cap waits: {users} users behind a cap of {cap}: {now} wait "
                     f"(the gauges saw at most {waited_max:.0f}); behind {2 * cap}: {doubled} would wait")
