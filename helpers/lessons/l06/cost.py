"""Speculation's cost side: what one guess costs (c, in target steps), the speed-up E / (1 + k c) it predicts
(Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", Theorem 3.8) against the one
measured, the talk's worked example, when batching erodes the gain, and a published GPU measurement beside this
run's (labelled as not from this run).

c is measured on the untrained draft: it has the trained draft's shape, so a guess costs the same, but it is almost
never accepted, so its step yields about one token and its time per token, against the baseline's, is the cost of
one speculative step: 1 + k c target steps. The verification of k + 1 tokens is counted as one target step, so c
also carries the verification's extra width (free on a GPU's memory-bound decode, not on a CPU).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion
from helpers.planning.acceptance import expected_accepted_length, first_guess_acceptance, speculative_speedup

# The talk this kit grew from, its slide on what speculation costs: a target step of 20 ms, a draft guess of 5 ms,
# 4 guesses and one 25 ms verification step of the target (the 4 tokens cost 4 x 20 = 80 ms without speculation).
TALK_EXAMPLE = {"target_step_ms": 20.0, "draft_ms_per_guess": 5.0, "k": 4, "verify_ms": 25.0}

# One published GPU measurement, not from this run: the vLLM team's blog, "How Speculative Decoding Boosts vLLM
# Performance by up to 2.8x", 2024-10-17, https://blog.vllm.ai/2024/10/17/spec-decode.html (figures 5 and 7).
PUBLISHED_GPU = {"setup": "Llama3-70B on 4x H100, draft turboderp/Qwama-0.5B-Instruct, ShareGPT",
                 "low_load": "up to 1.5x faster at 1 query per second", "high_load": "1.4x slower at high QPS",
                 "source": "vLLM blog, How Speculative Decoding Boosts vLLM Performance by up to 2.8x (2024-10-17), "
                           "https://blog.vllm.ai/2024/10/17/spec-decode.html"}
WITHIN = 0.15  # the prediction "agrees" when within this share of the measured speed-up (or the run's spread)


def step_arithmetic(target_step_ms: float, draft_ms_per_guess: float, k: int, verify_ms: float) -> dict[str, float]:
    """k tokens the plain way (k target steps) against k guesses and one verification, in ms, when all k guesses
    are accepted; c = a guess in target steps, and the speed-up that gives."""
    plain, speculative = k * target_step_ms, k * draft_ms_per_guess + verify_ms
    return {"k": k, "target_step_ms": target_step_ms, "draft_ms_per_guess": draft_ms_per_guess, "verify_ms": verify_ms,
            "plain_ms": plain, "speculative_ms": speculative, "c": draft_ms_per_guess / target_step_ms,
            "speedup_if_all_accepted": plain / speculative}


def talk_speedups(target_step_ms: float, draft_ms_per_guess: float, k: int, verify_ms: float) -> list[tuple[float, str]]:
    """The three speed-ups (x) one all-accepted example can be read as, each with what it assumes: k guesses
    against k plain steps; k + 1 tokens (the target's own one counted); and E / (1 + k c) with c the draft's time
    alone, which prices the verification as a plain step. With c carrying the verification's extra width,
    c = (speculative step / target step - 1) / k, the formula gives the second reading exactly."""
    speculative = k * draft_ms_per_guess + verify_ms
    c_draft = draft_ms_per_guess / target_step_ms
    c_width = (speculative / target_step_ms - 1) / k
    return [
        (k * target_step_ms / speculative, f"{k} guesses against {k} plain steps, the target's own extra token left out"),
        ((k + 1) * target_step_ms / speculative,
         f"{k + 1} tokens per speculative step (the target's own one counted) = E / (1 + k c) with E = {k + 1} and "
         f"c = {c_width:.4f}, the verification's extra {verify_ms - target_step_ms:.0f} ms counted in c"),
        ((k + 1) / (1 + k * c_draft),
         f"E / (1 + k c) with c = {draft_ms_per_guess:.0f} / {target_step_ms:.0f} = {c_draft:.2f}, the draft alone: "
         f"the verification priced as one {target_step_ms:.0f} ms step, not {verify_ms:.0f} ms"),
    ]


def arithmetic_table(baseline_tpot_ms: float | None, c: float | None, k: int) -> pd.DataFrame:
    """The talk's example and the same arithmetic with this run's target step (the baseline's TPOT, ms) and
    measured cost per guess ``c`` (the verification counted as one step: c carries its extra width)."""
    rows = [{"case": "the talk", **step_arithmetic(**TALK_EXAMPLE)}]
    if baseline_tpot_ms and c is not None and c == c:
        rows.append({"case": "this run", **step_arithmetic(baseline_tpot_ms, c * baseline_tpot_ms, k, baseline_tpot_ms)})
    return pd.DataFrame(rows)


def arithmetic_sentence(table: pd.DataFrame) -> str:
    """One line per row of ``arithmetic_table``: plain ms against speculative ms, written out."""
    return "\n".join(f"{r.case}: {r.k} x {r.target_step_ms:.1f} ms = {r.plain_ms:.1f} ms without speculation, against "
                     f"{r.k} x {r.draft_ms_per_guess:.1f} ms + {r.verify_ms:.1f} ms = {r.speculative_ms:.1f} ms with it "
                     f"(c = {r.c:.2f}): {r.speedup_if_all_accepted:.2f}x if every guess is accepted"
                     for r in table.itertuples())


def cost_table(table: pd.DataFrame, runs: pd.DataFrame, aligned: str, misaligned: str, k: int) -> pd.DataFrame:
    """One row per concurrency: c (the misaligned draft's cost per guess, ``speedups``' draft_cost_x), the aligned
    draft's first-guess acceptance a, E from the formula, the predicted speed-up E / (1 + k c), the measured decode
    speed-up (baseline TPOT / aligned TPOT), the throughput ratio, the break-even c = (E - 1) / k, and ``consistent``
    (False when either draft's step measured cheaper than a plain one: the baseline was slowed by something else)."""
    rows = []
    for _, r in table[table.config == aligned].sort_values("concurrency").iterrows():
        mis = table[(table.config == misaligned) & (table.concurrency == r.concurrency)]
        c = mis.draft_cost_x.iloc[0] if len(mis) and mis.draft_cost_x.iloc[0] is not None else None
        a = first_guess_acceptance(runs, aligned, r.concurrency)
        e = expected_accepted_length(a, k) if a is not None else None
        measured = r.baseline_tpot_ms / r.mean_tpot_ms if r.baseline_tpot_ms and r.mean_tpot_ms else None
        rows.append({"concurrency": int(r.concurrency), "k": k, "c": c, "a_first_guess": a, "E_formula": e,
                     "E_measured": r.mean_acceptance_length,
                     "predicted_speedup": speculative_speedup(e, k, c) if e is not None and c is not None and c == c else None,
                     "measured_speedup": measured, "throughput_ratio": r.speedup, "break_even_c": (e - 1) / k if e else None,
                     "step_cost_aligned": r.step_cost_x, "step_cost_misaligned": 1 + k * c if c is not None else None,
                     "noise_rel": r.noise_rel, "baseline_tpot_ms": r.baseline_tpot_ms,
                     "consistent": bool(r.get("consistent", True)) and (not len(mis) or bool(mis.consistent.iloc[0]))})
    return pd.DataFrame(rows)


def _tolerance(noise_rel: Any, within: float) -> float:
    return max(within, noise_rel) if isinstance(noise_rel, float) and noise_rel == noise_rel else within


def cost_conclusion(row: dict[str, Any], within: float = WITHIN) -> Conclusion:
    """Did E / (1 + k c) predict the measured decode speed-up (a ``cost_table`` row) within ``within`` or the run's
    spread? When not, which factor missed: the formula's E against the counted one, or the step's cost."""
    pred, meas, c, e = row.get("predicted_speedup"), row.get("measured_speedup"), row.get("c"), row.get("E_formula")
    if pred is None or meas is None or pred != pred or meas != meas:
        return Conclusion(f"concurrency {row.get('concurrency')}: no prediction (a draft proposed nothing, or a step "
                          "time is missing).", WITHIN_NOISE)
    k, tol = int(row["k"]), _tolerance(row.get("noise_rel"), within)
    if not row.get("consistent", True):
        return Conclusion(f"concurrency {int(row['concurrency'])}: no test of the cost model: a speculative step measured "
                          "cheaper than a plain one, which no machine does, so the baseline's runs were slowed by "
                          "something else (a busy machine); re-run on a quiet machine, with REPEATS >= 2.", WITHIN_NOISE)
    head = (f"concurrency {int(row['concurrency'])}: a guess cost c = {c:.2f} of a target step (the untrained draft's steps), "
            f"E = {e:.2f} tokens per step (a = {row['a_first_guess']:.0%}, k = {k}), so E / (1 + k c) = {e:.2f} / "
            f"{1 + k * c:.2f} = {pred:.2f}x predicted against {meas:.2f}x measured (baseline TPOT / speculative TPOT); "
            f"speculation pays while c < (E - 1) / k = {row['break_even_c']:.2f}")
    gap = pred / meas - 1
    if abs(gap) <= tol:
        return Conclusion(f"{head}: within {tol:.0%}, the cost model explains the measurement.", SHOWN)
    parts = []
    if row.get("E_measured"):
        parts.append(f"the formula's E {e:.2f} against {row['E_measured']:.2f} counted ({e / row['E_measured'] - 1:+.0%})")
    if row.get("step_cost_aligned") and row.get("step_cost_misaligned"):
        parts.append(f"a step of the untrained draft cost {row['step_cost_misaligned']:.2f} target steps, of the trained "
                     f"one {row['step_cost_aligned']:.2f} ({row['step_cost_aligned'] / row['step_cost_misaligned'] - 1:+.0%})")
    return Conclusion(f"{head}: off by {gap:+.0%}, beyond {tol:.0%}; the factors: {'; '.join(parts) or 'not measured'}.",
                      NOT_SHOWN)


def batching_conclusion(rows: pd.DataFrame, within: float = WITHIN) -> Conclusion:
    """When batching erodes the gain, from the ``cost_table`` rows at the lowest and highest concurrency: c against
    the break-even (E - 1) / k, the predicted and measured speed-ups, and where speculation stopped paying."""
    rows = rows.dropna(subset=["measured_speedup"]).sort_values("concurrency")
    if len(rows) < 2:
        return Conclusion("batching: fewer than two concurrencies measured, no trend to read.", WITHIN_NOISE)
    lo, hi = rows.iloc[0], rows.iloc[-1]
    if "consistent" in rows and not rows.consistent.all():
        return Conclusion(f"batching: no trend can be read from concurrency {int(lo.concurrency)} to {int(hi.concurrency)}: "
                          "a speculative step measured cheaper than a plain one (a busy machine slowed the baseline's "
                          "runs).", WITHIN_NOISE)
    fmt = lambda v: "n/a" if v is None or v != v else f"{v:.2f}"  # noqa: E731
    head = (f"batching, concurrency {int(lo.concurrency)} -> {int(hi.concurrency)}: c {fmt(lo.c)} -> {fmt(hi.c)} against a "
            f"break-even (E - 1) / k of {fmt(lo.break_even_c)} -> {fmt(hi.break_even_c)}; predicted "
            f"{fmt(lo.predicted_speedup)}x -> {fmt(hi.predicted_speedup)}x, measured {fmt(lo.measured_speedup)}x -> "
            f"{fmt(hi.measured_speedup)}x")
    losing = rows[rows.measured_speedup < 1 - _tolerance(rows.noise_rel.max(), within)]
    where = (f"; speculation stopped paying from concurrency {int(losing.concurrency.iloc[0])}" if len(losing) and
             lo.measured_speedup >= 1 else "; it did not pay at any concurrency measured" if len(losing) == len(rows)
             else "")
    change, tol = hi.measured_speedup / lo.measured_speedup - 1, _tolerance(max(lo.noise_rel, hi.noise_rel), within)
    if abs(change) <= tol:
        return Conclusion(f"{head}: about the same ({change:+.0%}, inside {tol:.0%}){where}.", WITHIN_NOISE)
    if change < 0:
        return Conclusion(f"{head}: the gain eroded ({change:+.0%}): batching erodes it once the step the guesses ride on "
                          f"stops being nearly free, i.e. as c nears (E - 1) / k{where}.", SHOWN)
    return Conclusion(f"{head}: the gain grew with the batch ({change:+.0%}), against the expectation{where}.", NOT_SHOWN)


def gpu_beside_cpu(row: dict[str, Any], profile: str) -> pd.DataFrame:
    """This run's decode speed-up at the lowest concurrency, its prediction, and the published GPU measurement
    (``PUBLISHED_GPU``), each labelled with where it comes from."""
    fmt = lambda v: "n/a" if v is None or v != v else f"{v:.2f}x"  # noqa: E731
    return pd.DataFrame([
        {"what": f"measured, concurrency {row.get('concurrency')}", "speed-up": fmt(row.get("measured_speedup")),
         "where from": f"this run ({profile})"},
        {"what": "predicted, E / (1 + k c)", "speed-up": fmt(row.get("predicted_speedup")),
         "where from": f"this run's c and acceptance ({profile})"},
        {"what": f"published: {PUBLISHED_GPU['setup']}",
         "speed-up": f"{PUBLISHED_GPU['low_load']}; {PUBLISHED_GPU['high_load']}",
         "where from": f"not from this run: {PUBLISHED_GPU['source']}"},
    ])
