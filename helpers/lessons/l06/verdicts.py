"""Notebook 06's verdicts: each method's speed against the baseline's spread, the trend with concurrency, acceptance
aligned vs misaligned, the number of guesses, the formula against the counters, and the CPU vs GPU caveat."""

from __future__ import annotations

from typing import Any

import pandas as pd

from helpers.core.comparison import BETTER, SAME, WORSE, Verdict, compare_samples
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, lesson_verdict
from helpers.lessons.l06.runs import BASELINE, _mean




def speedups(table: pd.DataFrame, baseline: str = BASELINE, k: dict[str, int] | None = None) -> pd.DataFrame:
    """One row per method and concurrency: mean throughput, its ratio to the baseline judged against the
    repeats' spread (``verdict``), acceptance, tokens per step and what one speculative step cost.

    ``step_cost_x``: a speculative step's time in plain decode steps (TPOT x tokens per step / baseline
    TPOT); ``draft_cost_x``: the part above one step spread over the k guesses (``k``: guesses per method),
    about what one draft token (and its share of the wider verification) costs next to a target step.
    ``consistent``: False when a speculative step measured cheaper than a plain one beyond the noise, which
    no machine does (a draft step and a verification cost at least one step): the baseline's runs were
    slowed by something else, and the ratio says nothing about speculation."""
    rows = []
    for (config, c), group in table[table.config != baseline].groupby(["config", "concurrency"], sort=False):
        base = table[(table.config == baseline) & (table.concurrency == c)]
        verdict = compare_samples(base.output_tok_s.tolist(), group.output_tok_s.tolist(), higher_is_better=True)
        base_tpot, tpot = _mean(base.mean_tpot_ms), _mean(group.mean_tpot_ms)
        length = _mean(group.mean_acceptance_length) or 1.0
        step_cost = tpot * length / base_tpot if base_tpot and tpot else None
        guesses = (k or {}).get(config)
        consistent = step_cost is None or verdict.noise_rel != verdict.noise_rel or step_cost >= 1 - verdict.noise_rel
        rows.append({"config": config, "concurrency": c, "output_tok_s": verdict.mean_b, "baseline_tok_s": verdict.mean_a,
                     "speedup": verdict.ratio, "verdict": verdict.label, "noise_rel": verdict.noise_rel,
                     "verdict_detail": verdict.describe(), "acceptance_rate": _mean(group.acceptance_rate),
                     "mean_acceptance_length": length, "tokens_per_chunk": _mean(group.tokens_per_chunk),
                     "baseline_tpot_ms": base_tpot, "mean_tpot_ms": tpot, "step_cost_x": step_cost,
                     "draft_cost_x": None if step_cost is None or not guesses else max(0.0, step_cost - 1) / guesses,
                     "consistent": consistent, "_verdict": verdict})
    return pd.DataFrame(rows)


def _pct(value: float | None) -> str:
    return "n/a (no drafts proposed)" if value is None or value != value else f"{value:.1%}"


def _why_not_faster(row: dict[str, Any]) -> str:
    """What the numbers say about a speculative method that did not speed up."""
    step, length, rate = row.get("step_cost_x"), row.get("mean_acceptance_length") or 1.0, row.get("acceptance_rate")
    parts = []
    if step is not None:
        parts.append(f"one speculative step took {step:.1f}x a plain step's time and yielded {length:.2f} tokens")
        if row.get("draft_cost_x") is not None:
            parts.append(f"each guessed token cost about {row['draft_cost_x']:.2f} of a target step (draft plus "
                         "wider verification)")
    if rate is not None and rate == rate and rate < 0.5:
        parts.append(f"only {rate:.0%} of the guesses were accepted")
    return "; ".join(parts) if parts else "no step timing to explain it"


def method_conclusion(row: dict[str, Any], expect: str | None = None, regressed: list[str] | None = None) -> Conclusion:
    """The sentence for one method at one concurrency (a ``speedups`` row): speed vs baseline within noise,
    acceptance, and why when it did not pay. ``expect``: BETTER (the lesson expects a speed-up), WORSE, or None."""
    verdict: Verdict = row["_verdict"]
    head = (f"{row['config']}, concurrency {row['concurrency']}: {row['output_tok_s']:.0f} vs "
            f"{row['baseline_tok_s']:.0f} output tok/s = {verdict.describe()}; acceptance {_pct(row['acceptance_rate'])}, "
            f"{row['mean_acceptance_length']:.2f} tokens per step, TPOT {row['baseline_tpot_ms']:.1f} -> "
            f"{row['mean_tpot_ms']:.1f} ms")
    if not row.get("consistent", True):
        quality = f"; eval regressed in {', '.join(regressed)}" if regressed else ""
        return Conclusion(f"{head}. Not a measurement of speculation: a speculative step measured "
                          f"{row['step_cost_x']:.1f}x a plain step, and no step with a draft and a verification is "
                          "cheaper than a plain one, so the baseline's runs were slowed by something else (a busy "
                          f"machine); re-run on a quiet machine, with REPEATS >= 2{quality}.",
                          "" if expect is None else WITHIN_NOISE)
    if verdict.label == BETTER:
        tail = f"faster: {row['mean_acceptance_length']:.2f} tokens per step outweighed the step's cost"
        if row.get("step_cost_x") is not None:
            tail += f" ({row['step_cost_x']:.1f}x a plain step)"
    elif verdict.label == WORSE:
        tail = "slower: " + _why_not_faster(row)
    elif verdict.label == SAME:
        tail = (f"no measurable difference: {verdict.ratio - 1:+.0%} is inside the run-to-run spread "
                f"(+/-{verdict.noise_rel:.0%})")
    else:
        tail = "not measured"
    quality = f"; eval regressed in {', '.join(regressed)}" if regressed else ""
    return Conclusion(f"{head}. {tail}{quality}.", "" if expect is None else lesson_verdict(verdict, expect))


def trend_conclusion(name: str, low: dict[str, Any], high: dict[str, Any]) -> Conclusion:
    """Does the speed-up shrink from the lowest to the highest concurrency (``speedups`` rows)? On a GPU it
    does: a bigger batch already uses the weights each step reads, leaving less for speculation to win."""
    lo, hi = low["speedup"], high["speedup"]
    if not (low.get("consistent", True) and high.get("consistent", True)):
        return Conclusion(f"{name}: no trend with concurrency can be read: the step times above are inconsistent "
                          "(a busy machine slowed the baseline's runs).", WITHIN_NOISE)
    noise = max(low["noise_rel"], high["noise_rel"])
    where = f"{name}: {lo:.2f}x at concurrency {low['concurrency']} -> {hi:.2f}x at {high['concurrency']}"
    if lo != lo or hi != hi:
        return Conclusion(f"{where}: not measured at both concurrencies.", WITHIN_NOISE)
    change = hi / lo - 1
    if abs(change) <= noise:
        return Conclusion(f"{where}: about the same (a {change:+.0%} change inside the +/-{noise:.0%} spread): "
                          "no trend with concurrency measurable here.", WITHIN_NOISE)
    if change < 0:
        return Conclusion(f"{where}: the gain shrinks as concurrency grows, as expected: a bigger batch already "
                          "makes use of each step, and every rejected guess still costs draft work.", SHOWN)
    steps = [r.get("step_cost_x") for r in (low, high)]
    reason = ("a speculative step cost {:.1f}x a plain step at concurrency {} but {:.1f}x at {}: the draft's "
              "per-step overhead is shared by more sequences in a batch".format(steps[0], low["concurrency"], steps[1],
                                                                                high["concurrency"])
              if None not in steps and steps[1] < steps[0] else
              "the step costs do not explain it; with a busy machine the runs at one concurrency may simply have "
              "been slowed more than the other's")
    return Conclusion(f"{where}: the ratio grew with concurrency, against the expectation of a smaller gain in "
                      f"bigger batches: {reason}.", NOT_SHOWN)


def acceptance_conclusion(aligned: list[float | None], misaligned: list[float | None]) -> Conclusion:
    """Aligned vs misaligned draft acceptance (fractions, one per run): the aligned draft should be accepted more."""
    verdict = compare_samples(misaligned, aligned, higher_is_better=True)
    a, m = _mean(aligned), _mean(misaligned)
    text = f"Aligned draft acceptance {_pct(a)} vs misaligned {_pct(m)}"
    if a is None or m is None:
        return Conclusion(text + ": not comparable (a draft proposed nothing).", WITHIN_NOISE)
    if verdict.label == BETTER or (m == 0 and a > 0):
        return Conclusion(text + ": a draft trained on the same text guesses what the target will say.", SHOWN)
    if verdict.label == SAME:
        return Conclusion(text + ": no measurable difference between the drafts on this traffic.", WITHIN_NOISE)
    return Conclusion(text + ": the untrained draft was accepted more, which only happens when both models "
                             "repeat the same tokens; look at the answers.", NOT_SHOWN)


def k_conclusion(k_rows: pd.DataFrame, baseline_tok_s: list[float], within: float = 0.05) -> Conclusion:
    """How many guesses (one row per k: output_tok_s, acceptance_rate, ``conditional``): the speed at each k, and at
    the largest k whether a guess further ahead is kept less often even when the one before it was kept (the
    conditional rates; the plain per-position rates cannot rise, since a guess counts only after every earlier one
    was kept, so their fall tests nothing). Shown when the last conditional rate is ``within`` below the first's."""
    k_rows = k_rows.sort_values("k")
    per_k = []
    for _, r in k_rows.iterrows():
        v = compare_samples(baseline_tok_s, [r.output_tok_s], higher_is_better=True)
        per_k.append(f"k={int(r.k)} {v.ratio:.2f}x (acceptance {_pct(r.acceptance_rate)})")
    best = k_rows.loc[k_rows.output_tok_s.idxmax()]
    best_v = compare_samples(baseline_tok_s, [best.output_tok_s], higher_is_better=True)
    head = f"Number of guesses: {', '.join(per_k)}; best k={int(best.k)} ({best_v.label} than no speculation)"
    last = k_rows.iloc[-1]
    conditional = last.get("conditional")
    rates = [c for c in conditional if c == c] if isinstance(conditional, (list, tuple)) else []
    if int(last.k) < 2 or len(rates) < 2:
        return Conclusion(head + f". The conditional acceptance needs k >= 2 with drafts at every position: not read "
                                 f"here (largest k={int(last.k)}).", WITHIN_NOISE)
    shown = ", ".join(f"{c:.0%}" for c in rates)
    text = (head + f". At k={int(last.k)}, each position's acceptance given the one before was kept: {shown} "
                   f"(position 1 to {len(rates)})")
    drop = rates[-1] - rates[0]
    if drop < -within:
        return Conclusion(text + ": a guess further ahead is kept less often even after its predecessors were, since "
                                 "it builds on the draft's own earlier guesses; each costs a full draft step.", SHOWN)
    if drop > within:
        return Conclusion(text + ": later guesses were kept more often once the earlier ones were (on this traffic a "
                                 "draft that got the start right is in an easy stretch, e.g. tool-call syntax), so the "
                                 "further guesses paid better than the first.", NOT_SHOWN)
    return Conclusion(text + f": within {within:.0%} of the first, as if each guess were an independent coin.",
                      WITHIN_NOISE)


def speculation_caveat(profile: str, draft_cost_x: float | None = None) -> Conclusion:
    """CPU vs GPU: why a CPU number says little about speculative decoding on a GPU; ``draft_cost_x`` (one guessed
    token's cost in target steps, measured) decides which way the CPU sentence goes."""
    gpu = ("On a GPU decode is memory-bound: verifying k tokens costs about one step (the weights are read once) "
           "and a draft about 10x smaller costs a fraction of one, so good acceptance gives a real speed-up at low "
           "concurrency.")
    if profile != "cpu":
        return Conclusion("GPU: " + gpu + (f" Here each guessed token cost about {draft_cost_x:.2f} of a target step."
                                           if draft_cost_x is not None and draft_cost_x == draft_cost_x else ""))
    fixed = ("on a CPU much of a decode step is fixed work (Python, scheduling, small matrix products on a few "
             "cores)")
    if draft_cost_x is None or draft_cost_x != draft_cost_x:
        return Conclusion(f"CPU vs GPU: {fixed}, so even a small draft's step costs nearly as much as the target's; "
                          f"k guesses then cost about k target steps and speculation rarely pays. {gpu}")
    if draft_cost_x >= 0.5:
        return Conclusion(f"CPU vs GPU: here each guessed token cost about {draft_cost_x:.2f} of a target step: {fixed}, "
                          f"so a small draft's step costs nearly as much as the target's, k guesses cost about k target "
                          f"steps and speculation rarely pays. {gpu}")
    return Conclusion(f"CPU vs GPU: here each guessed token cost only {draft_cost_x:.2f} of a target step (this draft is "
                      f"far smaller than the target), so speculation could pay even on this CPU. With a draft nearer the "
                      f"target's size it would not: {fixed}, so such a draft's step costs nearly as much as a target "
                      f"step. {gpu}")


def speculation_conclusions(runs: pd.DataFrame, table: pd.DataFrame, aligned: str, misaligned: str,
                            k_rows: pd.DataFrame | None = None, regressed: dict[str, list[str]] | None = None,
                            profile: str = "cpu") -> list[Conclusion]:
    """Notebook 06's "what we learned": each method at each concurrency (``speedups`` rows; the aligned draft is
    expected to be faster at the lowest concurrency, the misaligned one slower), the trend with concurrency,
    acceptance aligned vs misaligned, the number of guesses, and the CPU vs GPU caveat."""
    out: list[Conclusion] = []
    lowest = table.concurrency.min()
    for _, r in table.iterrows():
        expect = {aligned: BETTER if r.concurrency == lowest else None, misaligned: WORSE}.get(r.config)
        out.append(method_conclusion(r.to_dict(), expect, (regressed or {}).get(r.config)))
    for name in (aligned, misaligned):
        rows = table[table.config == name].sort_values("concurrency")
        if len(rows) >= 2:
            out.append(trend_conclusion(name, rows.iloc[0].to_dict(), rows.iloc[-1].to_dict()))
    out.append(acceptance_conclusion(runs[runs.config == aligned].acceptance_rate.tolist(),
                                     runs[runs.config == misaligned].acceptance_rate.tolist()))
    if k_rows is not None and len(k_rows):
        base = runs[(runs.config == BASELINE) & (runs.concurrency == lowest)].output_tok_s.tolist()
        out.append(k_conclusion(k_rows, base))
    low = table[(table.config == aligned) & (table.concurrency == lowest) & table.consistent]
    out.append(speculation_caveat(profile, low.draft_cost_x.iloc[0] if len(low) else None))
    return out


def aligned_vs_misaligned(runs: pd.DataFrame, aligned: str, misaligned: str) -> Conclusion:
    """``acceptance_conclusion`` on a run table: the aligned draft's acceptance against the misaligned one's; a
    plain "not run" line when either draft was left out (a room that downloads no such draft)."""
    missing = [name for name in (aligned, misaligned) if not (runs.config == name).any()]
    if missing:
        return Conclusion(f"not run: {' and '.join(missing)} left out of this run (see the method grid's output), so "
                          "the two drafts' acceptance is not compared here")
    return acceptance_conclusion(runs[runs.config == aligned].acceptance_rate.tolist(),
                                 runs[runs.config == misaligned].acceptance_rate.tolist())


def lowest_concurrency_conclusion(table: pd.DataFrame, name: str, expect: str = BETTER) -> Conclusion:
    """``method_conclusion`` for ``name`` at the lowest concurrency of a ``speedups`` table."""
    rows = table[table.config == name].sort_values("concurrency")
    if not len(rows):
        return Conclusion(f"{name} was not measured", WITHIN_NOISE)
    return method_conclusion(rows.iloc[0].to_dict(), expect)


def formula_conclusion(table: pd.DataFrame, within: float = 0.1) -> Conclusion:
    """How close the formula (i.i.d. acceptance) came to the measured accepted length for k > 1 (at k = 1 the two
    agree by construction), and why they differ: the conditional per-position acceptance. Shown when every k > 1
    is within ``within`` (a fraction) of the measurement. ``table``: ``expected_length_table`` rows."""
    tested = table[(table.k > 1) & (table.drafts > 0)] if len(table) else table
    if not len(tested):
        return Conclusion("no speculative configuration with k > 1 proposed drafts in this run: the formula was not "
                          "tested (at k = 1 it matches by construction)", WITHIN_NOISE)
    parts, worst, why, directions = [], 0.0, [], set()
    for _, r in tested.iterrows():
        rel = r.difference / r.measured_length if r.measured_length else 0.0
        worst = max(worst, abs(rel))
        parts.append(f"{r.config}: formula {r.formula_length:.2f} vs measured {r.measured_length:.2f} tokens per step "
                     f"({rel:+.0%}, a = {r.a_first_guess:.0%})")
        later = [c for c in r.conditional[1:] if c == c]
        if later and abs(rel) > within:
            direction = "higher" if sum(later) / len(later) > r.a_first_guess else "lower"
            directions.add(direction)
            why.append(f"{r.config}: after an accepted guess the next one was kept {', '.join(f'{c:.0%}' for c in later)} of the "
                       f"time against a = {r.a_first_guess:.0%} for the first ({direction})")
    text = "; ".join(parts)
    if worst <= within:
        return Conclusion(f"{text}: within {within:.0%}, so acceptance behaved about as if each guess were an "
                          "independent coin of probability a", SHOWN)
    because = {"higher": "once a draft is in an easy stretch (tool-call syntax, a copied name) its later guesses are "
                         "kept more often than the first, so the formula under-counts",
               "lower": "a guess further ahead builds on the draft's own earlier guesses and drifts from the target, "
                        "so later positions are kept less often than the first, and the formula over-counts"}
    reason = ("acceptance is not independent per position: " + "; ".join(why) + ". "
              + "; while ".join(because[d] for d in ("higher", "lower") if d in directions)
              + "; a wrong guess ends the step, whatever the later guesses were") if why else \
        "the per-position rates do not explain it (too few drafts to read them)"
    return Conclusion(f"{text}: the formula is off by up to {worst:.0%}: {reason}", NOT_SHOWN)


def length_gain_outcome(gain_tokens: float) -> str:
    """'under 0.25 tokens', '0.25 to 1 token' or 'over 1 token' per step."""
    return "under 0.25 tokens" if gain_tokens < 0.25 else "0.25 to 1 token" if gain_tokens <= 1 else "over 1 token"


SPEED_CHOICES = ("faster", "about the same", "slower")


def one_stream_outcome(table: pd.DataFrame, name: str) -> tuple[str, str]:
    """Notebook 06's core prediction: is ``name`` faster than no speculation at the lowest concurrency of a
    ``speedups`` table? (one of ``SPEED_CHOICES``, judged against the repeats' spread, "about the same" when the step
    times say a busy machine slowed the baseline; the sentence with the numbers)."""
    rows = table[table.config == name].sort_values("concurrency")
    if not len(rows):
        return "about the same", f"{name} was not measured"
    row = rows.iloc[0].to_dict()
    label = row["_verdict"].label if row.get("consistent", True) else SAME  # a busy machine: no speed-up can be read
    return {BETTER: "faster", WORSE: "slower"}.get(label, "about the same"), method_conclusion(row).text


def core_conclusions(table: pd.DataFrame, aligned: str, regressed: dict[str, list[str]] | None = None,
                     profile: str = "cpu") -> list[Conclusion]:
    """Notebook 06's "what we learned" on the core path, from section 3's ``speedups`` table alone (no speculation
    and the aligned draft): the aligned draft at each concurrency (expected faster at the lowest), its trend with
    concurrency and the CPU vs GPU caveat. ``speculation_conclusions`` adds Go deeper's methods and k."""
    rows = table[table.config == aligned].sort_values("concurrency")
    if not len(rows):
        return [Conclusion(f"{aligned} was not measured in this run", WITHIN_NOISE)]
    lowest = rows.concurrency.min()
    out = [method_conclusion(r.to_dict(), BETTER if r.concurrency == lowest else None, (regressed or {}).get(aligned))
           for _, r in rows.iterrows()]
    if len(rows) >= 2:
        out.append(trend_conclusion(aligned, rows.iloc[0].to_dict(), rows.iloc[-1].to_dict()))
    low = rows[(rows.concurrency == lowest) & rows.consistent]
    out.append(speculation_caveat(profile, low.draft_cost_x.iloc[0] if len(low) else None))
    return out
