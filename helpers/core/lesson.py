"""A lesson's scaffolding in the notebook: "what you should see" checks on this run's numbers, and the
"try it yourself" exercises that ask for a prediction first and then check it against the run.

Both print a few lines and return a small record, so a test can assert on the verdict. Neither raises on
a result that goes the unexpected way: the notebook says what it saw and why, and goes on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion

SEEN, NOT_SEEN, UNDECIDED = "seen", "not seen", "cannot tell"
_MARKS = {SEEN: "✔ seen in this run", NOT_SEEN: "✘ not seen in this run", UNDECIDED: "~ cannot tell from this run"}


@dataclass(frozen=True)
class Check:
    """One "what you should see" line: the claim, whether this run shows it, and the numbers behind it."""

    claim: str
    outcome: str  # SEEN, NOT_SEEN or UNDECIDED
    detail: str

    def __str__(self) -> str:
        detail = f": {self.detail}" if self.detail else ""
        return f"What you should see: {self.claim}\n  {_MARKS[self.outcome]}{detail}"


def _outcome(seen: bool | str | None) -> str:
    if seen is None:
        return UNDECIDED
    if isinstance(seen, str):
        outcomes = {SHOWN: SEEN, SEEN: SEEN, NOT_SHOWN: NOT_SEEN, NOT_SEEN: NOT_SEEN, WITHIN_NOISE: UNDECIDED,
                    UNDECIDED: UNDECIDED}
        if seen not in outcomes:
            raise ValueError(f"seen must be True, False, None or a lesson verdict ({SHOWN!r}, {NOT_SHOWN!r}, "
                             f"{WITHIN_NOISE!r}), not {seen!r}")
        return outcomes[seen]
    return SEEN if bool(seen) else NOT_SEEN  # numpy booleans included


def should_see(claim: str, seen: bool | str | None, detail: str = "", show: bool = True) -> Check:
    """Print and return the check of ``claim`` on this run: ``seen`` is True/False, None when the run cannot
    tell (noise, a missing side), or a lesson verdict (shown / not shown / within noise). ``detail`` holds
    the numbers, and, when the claim is not seen, why."""
    check = Check(claim.rstrip("."), _outcome(seen), detail)
    if show:
        print(check)
    return check


def should_see_conclusion(claim: str, conclusion: Conclusion, show: bool = True) -> Check:
    """The check of ``claim`` from a conclusion function's verdict, with its sentence as the detail."""
    return should_see(claim, conclusion.verdict or None, conclusion.text, show=show)


def show_conclusions(conclusions: Iterable[Conclusion], show: bool = True) -> list[Check]:
    """The check of each conclusion against the expectation it carries (``Conclusion.expectation``), printed in turn:
    the one loop every lesson step ends with."""
    return [should_see_conclusion(c.expectation, c, show=show) for c in conclusions]


# ---------------------------------------------------------------- try it yourself

@dataclass(frozen=True)
class Prediction:
    """An exercise's result: what the attendee predicted (None: no prediction), what the run gave, and
    whether they matched (None when there was nothing to compare)."""

    prediction: str | None
    outcome: str
    right: bool | None
    detail: str

    def __str__(self) -> str:
        lines = []
        if self.prediction is None:
            lines.append("You made no prediction: set MY_PREDICTION before running the cell, then run it again.")
        elif self.right is None:
            lines.append(f"Your prediction {self.prediction!r} is not one of the choices; "
                         "set MY_PREDICTION to one of them and run the cell again.")
        else:
            lines.append(f"You predicted {self.prediction!r}: " + ("right." if self.right else "not this time."))
        lines.append(f"This run: {self.outcome}." + (f" {self.detail}" if self.detail else ""))
        return "\n".join(lines)


def _normal(text: str) -> str:
    return " ".join(str(text).lower().split())


def check_prediction(prediction: str | None, outcome: str, choices: Sequence[str], detail: str = "",
                     show: bool = True) -> Prediction:
    """Print and return the attendee's ``prediction`` (one of ``choices``, case and spacing ignored) against
    the ``outcome`` this run measured (also one of ``choices``), with the numbers in ``detail``."""
    by_key = {_normal(c): c for c in choices}
    if _normal(outcome) not in by_key:
        raise ValueError(f"outcome {outcome!r} is not one of the choices {list(choices)}")
    outcome = by_key[_normal(outcome)]
    if prediction is None or (isinstance(prediction, str) and not prediction.strip()):
        result = Prediction(None, outcome, None, detail)
    elif _normal(prediction) not in by_key:
        result = Prediction(str(prediction), outcome, None, detail + f" (the choices: {', '.join(choices)})")
    else:
        result = Prediction(by_key[_normal(prediction)], outcome, by_key[_normal(prediction)] == outcome, detail)
    if show:
        print(result)
    return result


def ratio_outcome(before: float, after: float, about_same_within: float = 0.15,
                  words: tuple[str, str, str] = ("lower", "about the same", "higher")) -> str:
    """'lower', 'about the same' or 'higher' for ``after`` against ``before``: about the same when the
    ratio is within ``about_same_within`` (a fraction) of 1, or when both are zero."""
    if before == 0:
        return words[1] if after == 0 else words[2] if after > 0 else words[0]
    ratio = after / before
    if abs(ratio - 1) <= about_same_within:
        return words[1]
    return words[2] if ratio > 1 else words[0]
