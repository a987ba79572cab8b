"""Noise-aware comparisons: run A and B interleaved, keep every repeat, and judge a difference against
the run-to-run spread.

A difference smaller than the spread of the repeats is "no measurable difference", never a win or a
loss. With a single run on a side its spread is unknown: the verdict then takes the larger of
``SINGLE_RUN_NOISE_REL`` and the other side's measured spread, and says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# Single runs of the same load on one 2-core machine differ by about 10% (README, "Measurements and
# vllm bench serve": 4 alternating repeats of 64 requests each, per tool). Used only when a side has one run.
SINGLE_RUN_NOISE_REL = 0.10

BETTER, WORSE, SAME, UNKNOWN = "better", "worse", "no measurable difference", "not measured"


@dataclass(frozen=True)
class Verdict:
    """B against A: the ratio of means, the run-to-run spread it was judged against, and the label."""

    label: str                 # BETTER, WORSE, SAME or UNKNOWN (B's value against A's)
    mean_a: float
    mean_b: float
    ratio: float               # mean_b / mean_a
    noise_rel: float           # the relative difference below which the two count as equal
    n_a: int
    n_b: int
    spread_measured: bool      # False: one run on a side, the noise is the assumed SINGLE_RUN_NOISE_REL

    @property
    def shown(self) -> bool:
        """True when the difference is larger than the noise (either way)."""
        return self.label in (BETTER, WORSE)

    def describe(self) -> str:
        """'1.32x (noise +/-8%, 3 and 3 runs)', or with a single run on a side, the assumed floor named."""
        if self.label == UNKNOWN:
            return "not measured"
        runs = (f"{self.n_a} and {self.n_b} runs" if self.spread_measured else
                f"{self.n_a} and {self.n_b} run(s): a side ran once, so at least the assumed {SINGLE_RUN_NOISE_REL:.0%}")
        return f"{self.ratio:.2f}x (noise +/-{self.noise_rel:.0%}, {runs})"


def _clean(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and v == v]


def relative_spread(values: Sequence[float]) -> float:
    """(max - min) / mean of the repeats; 0 for fewer than two."""
    values = _clean(values)
    if len(values) < 2 or statistics.fmean(values) == 0:
        return 0.0
    return (max(values) - min(values)) / abs(statistics.fmean(values))


def compare_samples(a: Sequence[float | None], b: Sequence[float | None], higher_is_better: bool = True,
                    single_run_noise_rel: float = SINGLE_RUN_NOISE_REL) -> Verdict:
    """Judge B against A: a difference of means within the larger relative range of the two sides'
    repeats is SAME; a side with one run takes ``single_run_noise_rel`` as its spread."""
    a, b = _clean(a), _clean(b)
    if not a or not b or statistics.fmean(a) == 0:
        return Verdict(UNKNOWN, float("nan"), float("nan"), float("nan"), float("nan"), len(a), len(b), False)
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    measured = len(a) >= 2 and len(b) >= 2
    spread = max(relative_spread(a), relative_spread(b))  # a side with one run contributes 0
    noise = spread if measured else max(spread, single_run_noise_rel)
    ratio = mean_b / mean_a
    if abs(ratio - 1) <= noise:
        label = SAME
    else:
        label = BETTER if (ratio > 1) == higher_is_better else WORSE
    return Verdict(label, mean_a, mean_b, ratio, noise, len(a), len(b), measured)


def interleave(runs: dict[str, Callable[[], T]], repeats: int, desc: str = "runs",
               progress: bool | None = None, mirrored: bool = False) -> dict[str, list[T]]:
    """Run each configuration once per round, in the given order, for ``repeats`` rounds (A B A B ...):
    a drift of the machine during the runs hits every side alike. Returns each side's results in order.
    ``mirrored``: every second round runs in reverse (A B B A A B ...), so a round starts on the configuration the
    one before ended on; where each switch is an engine restart, that saves one per round, and a steady drift
    still hits every side alike.
    A bar named ``desc`` shows the configuration and round being run (in a notebook, or with ``progress``).

    If a run raises, the results so far are kept on the exception (``err.partial``) and it propagates."""
    from helpers.core.progress import steps

    results: dict[str, list[T]] = {name: [] for name in runs}
    rounds = max(1, repeats)
    names = list(runs)
    order = [(r, name) for r in range(rounds) for name in (names[::-1] if mirrored and r % 2 else names)]
    for r, name in steps(order, desc, "run", progress, label=lambda step: f"{step[1]}, round {step[0] + 1}/{rounds}"):
        try:
            results[name].append(runs[name]())
        except BaseException as err:
            err.partial = results  # type: ignore[attr-defined]
            raise
    return results
