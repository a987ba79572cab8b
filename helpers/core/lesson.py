"""A lesson's scaffolding in the notebook: "what you should see" checks on this run's numbers, the
"try it yourself" exercises that ask for a prediction first and then check it against the run, and the
code exercises whose few lines an assert checks.

Each prints a few lines and returns a small record, so a test can assert on the verdict. None raises on
a result that goes the unexpected way: the notebook says what it saw and why, and goes on. A prediction
not yet made shows no answer: it asks for one. A test run makes the prediction itself
(``$WORKSHOP_CI_PREDICTION``), so CI still sees every outcome; an attendee never sets it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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
    by: str = ""  # " (made by the test run)" when $WORKSHOP_CI_PREDICTION made it

    def __str__(self) -> str:
        lines = []
        if self.prediction is None:
            return ("Your turn: set MY_PREDICTION to one of the choices above and run this cell again; the answer "
                    "is shown once you have predicted.")
        if self.right is None:
            lines.append(f"Your prediction {self.prediction!r} is not one of the choices; "
                         "set MY_PREDICTION to one of them and run the cell again.")
        else:
            lines.append(f"You predicted {self.prediction!r}{self.by}: " + ("right." if self.right else "not this time."))
        lines.append(f"This run: {self.outcome}." + (f" {self.detail}" if self.detail else ""))
        return "\n".join(lines)


def _normal(text: str) -> str:
    return " ".join(str(text).lower().split())


CI_PREDICTION_ENV = "WORKSHOP_CI_PREDICTION"  # a test run's prediction: "first", "last" or a choice's index


def _ci_prediction(choices: Sequence[str]) -> str | None:
    """The prediction a test run makes for the attendee ($WORKSHOP_CI_PREDICTION), or None when it is not set."""
    value = os.environ.get(CI_PREDICTION_ENV, "").strip()
    if not value:
        return None
    index = {"first": 0, "last": -1}.get(value)
    if index is None:
        try:
            index = int(value)
        except ValueError:
            raise ValueError(f"{CI_PREDICTION_ENV}={value!r}: give first, last or a choice's index") from None
    return choices[index % len(choices)]


def check_prediction(prediction: str | None, outcome: str, choices: Sequence[str], detail: str = "",
                     show: bool = True) -> Prediction:
    """Print and return the attendee's ``prediction`` (one of ``choices``, case and spacing ignored) against
    the ``outcome`` this run measured (also one of ``choices``), with the numbers in ``detail``."""
    by_key = {_normal(c): c for c in choices}
    if _normal(outcome) not in by_key:
        raise ValueError(f"outcome {outcome!r} is not one of the choices {list(choices)}")
    outcome = by_key[_normal(outcome)]
    by = ""
    if prediction is None or (isinstance(prediction, str) and not prediction.strip()):
        prediction = _ci_prediction(choices)
        by = " (made by the test run)" if prediction is not None else ""
    if prediction is None:
        result = Prediction(None, outcome, None, detail)
    elif _normal(prediction) not in by_key:
        result = Prediction(str(prediction), outcome, None, detail + f" (the choices: {', '.join(choices)})")
    else:
        result = Prediction(by_key[_normal(prediction)], outcome, by_key[_normal(prediction)] == outcome, detail, by)
    if show:
        print(result)
    return result


# ---------------------------------------------------------------- write it yourself

@dataclass(frozen=True)
class Exercise:
    """A code exercise's result: not answered yet (``answered`` False) or answered and passed its check."""

    name: str
    answered: bool
    detail: str

    def __str__(self) -> str:
        if not self.answered:
            return f"Your turn ({self.name}): {self.detail}"
        return f"✔ {self.name}: right. {self.detail}".rstrip()


def check_exercise(name: str, answer: Any, check: Callable[[Any], str | None], hint: str, explain: str = "") -> Exercise:
    """Check the attendee's ``answer`` to the code exercise ``name``: None (not written yet) asks for an attempt and
    shows no hint (STYLE.md: a hint comes after a wrong attempt, never before one); otherwise ``check(answer)``
    returns None when it is right or the sentence that says what is wrong, and a wrong answer fails with that
    sentence and the ``hint`` (an ``AssertionError``, as an assert would). ``explain``: printed once it is right."""
    if answer is None:
        result = Exercise(name, False, NO_ATTEMPT)
        print(result)
        return result
    problem = check(answer)
    if problem:
        raise AssertionError(f"{name}: {problem} Hint: {hint}")
    result = Exercise(name, True, explain)
    print(result)
    return result


NO_ATTEMPT = ("replace the None with your answer and run the cell again; a wrong answer shows what is wrong and a "
              "hint, and the hidden cell below holds a worked solution")


@dataclass(frozen=True)
class Solution:
    """A worked solution's value, checked by the exercise's own check; it marks nothing right for the attendee."""

    name: str
    value: Any
    detail: str

    def __str__(self) -> str:
        return f"The worked solution ({self.name}): {self.detail}".rstrip()


def show_solution(name: str, value: Any, check: Callable[[Any], str | None], explain: str = "") -> Solution:
    """Print a worked solution's ``value`` for exercise ``name``, checked by the same ``check`` as the attendee's answer
    (an ``AssertionError`` if the solution itself is wrong). A solution cell calls this with its own names
    (``solution_...``), so that "Run All" neither overwrites the attendee's answer nor marks it right."""
    problem = check(value)
    if problem:
        raise AssertionError(f"the worked solution of {name} is wrong: {problem}")
    result = Solution(name, value, explain or f"{value!r}")
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
