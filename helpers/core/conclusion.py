"""A lesson's conclusion: the sentence computed from this run's numbers and, when the lesson expects an
effect, the verdict on it (shown / not shown / within noise).

Conclusion functions live in the lesson module of their notebook (``lessons.l01_connect.conclude_stream``,
``lessons.l07_saturation`` ...), or beside a measurement the command line reports too; each returns
:class:`Conclusion` objects, and a notebook prints them (``core.lesson.show_conclusions``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from helpers.core.comparison import BETTER, WORSE, Verdict

SHOWN, NOT_SHOWN, WITHIN_NOISE = "shown", "not shown", "within noise"


def lesson_verdict(verdict: Verdict, expect: str = BETTER) -> str:
    """The lesson verdict of a comparison whose expected label is ``expect`` (``better`` or ``worse``):
    shown when the difference beyond the noise goes the expected way, not shown when it goes the other
    way, within noise otherwise."""
    if verdict.label not in (BETTER, WORSE):
        return WITHIN_NOISE
    return SHOWN if verdict.label == expect else NOT_SHOWN


@dataclass(frozen=True)
class Conclusion:
    """One finding: ``text`` with its numbers; ``verdict`` on the lesson's expectation ("" when none)."""

    text: str
    verdict: str = ""
    expectation: str = ""  # what the lesson expected, in words ("" for a plain report)

    def __str__(self) -> str:
        if not self.verdict:
            return f"- {self.text}"
        return f"- [{self.verdict}] {self.expectation}: {self.text}" if self.expectation else \
            f"- [{self.verdict}] {self.text}"


def report(*items: Conclusion | Iterable[Conclusion] | str | None) -> str:
    """The lines of several conclusions (or lists of them, or plain strings), one per line."""
    lines: list[str] = []
    for item in items:
        if item is None:
            continue
        if isinstance(item, (Conclusion, str)):
            lines.append(str(item) if isinstance(item, Conclusion) or item.startswith("- ") else f"- {item}")
        else:
            lines.extend(str(c) for c in item)
    return "\n".join(lines)


def plural(count: float, noun: str, plural_noun: str | None = None) -> str:
    """'1 conversation', '3 conversations', '0 conversations' (count formatted with thousands separators)."""
    word = noun if count == 1 else (plural_noun or noun + "s")
    shown = f"{count:,}" if isinstance(count, int) or float(count).is_integer() else f"{count:,.1f}"
    if not isinstance(count, int) and float(count).is_integer():
        shown = f"{int(count):,}"
    return f"{shown} {word}"
