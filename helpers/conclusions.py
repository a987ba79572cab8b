"""A lesson's conclusion: the sentence computed from this run's numbers, and whether the effect the
lesson expects showed.

The verdicts:
- ``shown``: the expected effect is larger than the run-to-run noise;
- ``not shown``: the numbers go the other way, beyond the noise;
- ``within noise``: the difference is smaller than the noise, so no conclusion either way;
- ``info``: a statement that expects no effect (a caveat, a figure).
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers.comparison import BETTER, SAME, WORSE, Verdict

SHOWN, NOT_SHOWN, WITHIN_NOISE, INFO = "shown", "not shown", "within noise", "info"


@dataclass(frozen=True)
class Conclusion:
    """One "what we learned" sentence and its verdict (``shown``, ``not shown``, ``within noise`` or ``info``)."""

    text: str
    verdict: str = INFO

    def __str__(self) -> str:
        return self.text if self.verdict == INFO else f"{self.text} [{self.verdict}]"


def expected(verdict: Verdict, expect: str = BETTER) -> str:
    """The lesson verdict of a comparison whose expected label is ``expect`` (``better`` or ``worse``)."""
    if verdict.label == SAME or verdict.label not in (BETTER, WORSE):
        return WITHIN_NOISE
    return SHOWN if verdict.label == expect else NOT_SHOWN


def lines(conclusions: list[Conclusion]) -> str:
    """The conclusions as a bulleted text block, one per line."""
    return "\n".join(f"- {c}" for c in conclusions)
