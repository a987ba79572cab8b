"""Noise-aware comparisons: a difference within the repeats' spread is no difference."""

from __future__ import annotations

import pytest

from helpers.core.comparison import BETTER, SAME, UNKNOWN, WORSE, compare_samples, interleave, relative_spread


def test_a_difference_beyond_the_spread_is_a_win_or_a_loss_by_direction():
    v = compare_samples([100, 104, 98], [130, 128, 133])
    assert v.label == BETTER and v.shown and v.ratio == pytest.approx(391 / 302) and v.spread_measured
    assert compare_samples([100, 104, 98], [130, 128, 133], higher_is_better=False).label == WORSE
    assert compare_samples([130, 128, 133], [100, 104, 98]).label == WORSE


def test_a_difference_within_the_spread_is_no_measurable_difference():
    v = compare_samples([100, 130, 90], [110, 105, 120])  # +10% of means, but A alone ranged 40%
    assert v.label == SAME and not v.shown
    assert v.noise_rel == pytest.approx(max(relative_spread([100, 130, 90]), relative_spread([110, 105, 120])))
    assert v.describe() == "1.05x (noise +/-38%, 3 and 3 runs)"


def test_one_run_a_side_assumes_the_documented_noise_and_says_so():
    assert compare_samples([100], [108]).label == SAME
    v = compare_samples([100], [150])
    assert v.label == BETTER and not v.spread_measured and "a side ran once, so at least the assumed 10%" in v.describe()
    wide = compare_samples([100, 140], [125])  # the baseline's own repeats spread 33%: +4% is within it
    assert wide.label == SAME and wide.noise_rel == pytest.approx(40 / 120)


def test_missing_numbers_are_not_measured_rather_than_zero():
    assert compare_samples([], [1.0]).label == UNKNOWN
    assert compare_samples([float("nan")], [1.0]).label == UNKNOWN
    assert compare_samples([1.0, None], [2.0]).n_a == 1


def test_interleave_runs_a_b_a_b_and_keeps_partial_results_on_failure():
    order = []

    def run(name):
        def go():
            order.append(name)
            if name == "B" and order.count("B") == 2:
                raise RuntimeError("engine died")
            return len(order)
        return go

    with pytest.raises(RuntimeError) as info:
        interleave({"A": run("A"), "B": run("B")}, repeats=3)
    assert order == ["A", "B", "A", "B"]
    assert info.value.partial == {"A": [1, 3], "B": [2]}
    assert interleave({"A": lambda: 1, "B": lambda: 2}, repeats=2) == {"A": [1, 1], "B": [2, 2]}


def test_mirrored_rounds_start_where_the_round_before_ended():
    order = []

    def run(name):
        return lambda: order.append(name) or len(order)

    results = interleave({n: run(n) for n in "ABC"}, repeats=3, mirrored=True)
    assert "".join(order) == "ABCCBAABC"  # a switch saved at each round's turn, every side in every round
    assert results == {"A": [1, 6, 7], "B": [2, 5, 8], "C": [3, 4, 9]}
    order.clear()
    interleave({n: run(n) for n in "AB"}, repeats=2)
    assert order == ["A", "B", "A", "B"]  # not mirrored unless asked
