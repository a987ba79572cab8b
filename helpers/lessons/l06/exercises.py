"""Notebook 06's code exercise: the checker of the learner's tokens per step, E for a given acceptance and k."""

from __future__ import annotations

from collections.abc import Callable

from helpers.planning.acceptance import expected_accepted_length


def tokens_per_step_check(a: float, k: int) -> Callable[[float], str | None]:
    """A ``check_exercise`` check: None when the answer is E = (1 - a^(k+1)) / (1 - a) for ``a`` and ``k``, else the
    sentence that says what is wrong (the guesses without the target's token, more than k + 1, a plain mistake)."""
    right = expected_accepted_length(a, k)

    def check(answer: float) -> str | None:
        try:
            value = float(answer)
        except (TypeError, ValueError):
            return f"the answer must be a number of tokens per step, not {answer!r}."
        if abs(value - right) <= 1e-6 * max(1.0, right):
            return None
        if abs(value - (right - 1)) <= 1e-6 * max(1.0, right):
            return "that counts the guesses kept only: a step also yields the target's own token (+1)."
        if value > k + 1:
            return f"no step yields more than k + 1 = {k + 1} tokens (every guess kept, plus the target's own)."
        if value < 1:
            return "every step yields at least one token, the target's own, even when every guess is rejected."
        return f"{value:.4g} is not (1 - a^(k+1)) / (1 - a) for a = {a:g}, k = {k}."
    return check
