"""Speculative decoding's expected accepted length: the formula for independent guesses, (1 - a^(k+1)) / (1 - a)
tokens per verification step (Leviathan et al. 2023), against what vLLM's spec-decode counters measured.

Pure arithmetic on run tables (``helpers.lessons.l06.runs.measure_speculation`` rows: ``spec_drafts`` and
``per_position_acceptance``), so a figure module may use it; notebook 06's verdict on the formula
(``formula_conclusion``) lives in its lesson module.
"""

from __future__ import annotations

import pandas as pd


def expected_accepted_length(a: float, k: int) -> float:
    """Tokens per verification step (the target's bonus token included) when each of ``k`` guesses is accepted
    with probability ``a`` independently of the others: (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023, "Fast
    Inference from Transformers via Speculative Decoding", eq. 1)."""
    if not 0 <= a <= 1:
        raise ValueError(f"an acceptance rate is a fraction between 0 and 1, not {a}")
    if k < 0:
        raise ValueError("k (guesses per step) must be >= 0")
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def conditional_rates(rates: list[float]) -> list[float]:
    """Each draft position's acceptance given the one before was accepted, from vLLM's per-position rates (the share
    of drafts whose guess at that position was kept). A guess counts only when every earlier one was kept, so the
    per-position rates can never rise; these can, fall, or stay at the first guess's rate (independent guesses)."""
    if not rates:
        return []
    return [rates[0]] + [rates[i] / rates[i - 1] if rates[i - 1] else float("nan") for i in range(1, len(rates))]


def pooled_per_position(group: pd.DataFrame) -> tuple[float, list[float] | None]:
    """(drafts, per-position acceptance) of a group of ``measure_speculation`` rows, pooled over runs by drafts."""
    return _pooled_positions(group) if "per_position_acceptance" in group else (0.0, None)


def _pooled_positions(group: pd.DataFrame) -> tuple[float, list[float] | None]:
    """(drafts, per-position acceptance) pooled over runs, each run weighted by its number of drafts."""
    drafts, counts = 0.0, None
    for _, r in group.iterrows():
        n, rates = r.get("spec_drafts"), r.get("per_position_acceptance")
        if not n or not isinstance(rates, (list, tuple)) or not rates:
            continue
        counts = [0.0] * len(rates) if counts is None else counts + [0.0] * (len(rates) - len(counts))
        for i, rate in enumerate(rates):
            counts[i] += rate * n
        drafts += n
    return drafts, None if counts is None or not drafts else [c / drafts for c in counts]


def expected_length_table(runs: pd.DataFrame, k_by_config: dict[str, int], concurrency: int) -> pd.DataFrame:
    """Formula against measurement, one row per speculative configuration at ``concurrency``: ``a`` (the first
    guess's acceptance, from vLLM's per-position counters), the formula's accepted length for ``a`` and k, the
    measured one (1 + accepted / drafts), their difference, the per-position acceptance and each position's
    acceptance given the one before was accepted (``conditional``: all equal to a if guesses were i.i.d.)."""
    rows = []
    for config, k in k_by_config.items():
        group = runs[(runs.config == config) & (runs.concurrency == concurrency)]
        drafts, rates = _pooled_positions(group) if "per_position_acceptance" in group else (0.0, None)
        if not rates:
            continue
        a, conditional = rates[0], conditional_rates(rates)
        measured, formula = 1 + sum(rates), expected_accepted_length(a, k)
        rows.append({"config": config, "k": k, "drafts": int(drafts), "a_first_guess": a, "formula_length": formula,
                     "measured_length": measured, "difference": measured - formula,
                     "per_position": [round(r, 3) for r in rates], "conditional": [round(c, 3) for c in conditional]})
    return pd.DataFrame(rows)


def more_guesses(a: float, k_from: int, k_to: int) -> tuple[float, str]:
    """Tokens per step gained by guessing ``k_to`` instead of ``k_from`` tokens at first-guess acceptance ``a``
    (the formula), with the numbers and the ceiling 1 / (1 - a) that no k exceeds."""
    before, after = expected_accepted_length(a, k_from), expected_accepted_length(a, k_to)
    ceiling = "no ceiling (every guess accepted)" if a >= 1 else f"no k gives more than 1/(1-a) = {1 / (1 - a):.2f}"
    return after - before, (f"a = {a:.0%}: k={k_from} gives {before:.2f} tokens per step, k={k_to} {after:.2f} "
                            f"({after - before:+.2f}), while each extra guess costs a draft step; {ceiling}")


def first_guess_acceptance(runs: pd.DataFrame, config: str, concurrency: int) -> float | None:
    """The share of first guesses accepted (vLLM's per-position counters pooled over runs, weighted by drafts) of
    ``config`` at ``concurrency``; None when it proposed no drafts there."""
    group = runs[(runs.config == config) & (runs.concurrency == concurrency)]
    _, rates = _pooled_positions(group) if "per_position_acceptance" in group else (0.0, None)
    return rates[0] if rates else None


def speculative_speedup(expected_tokens_per_step: float, k: int, cost_per_guess: float) -> float:
    """The decode speed-up E / (1 + k c): ``expected_tokens_per_step`` E per verification step, which costs one target
    step plus ``k`` guesses at ``cost_per_guess`` c target steps each (Leviathan et al. 2023, Theorem 3.8)."""
    if k < 0 or cost_per_guess < 0:
        raise ValueError("k and the cost per guess c are >= 0")
    return expected_tokens_per_step / (1 + k * cost_per_guess)
