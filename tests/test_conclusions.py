"""A lesson verdict from a comparison: shown, not shown or within noise."""

from helpers.comparison import compare_samples
from helpers.conclusions import INFO, NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, expected, lines


def test_the_verdict_follows_the_expected_direction():
    faster = compare_samples([100, 102], [150, 152])
    assert expected(faster, "better") == SHOWN and expected(faster, "worse") == NOT_SHOWN
    assert expected(compare_samples([100, 120], [110, 105]), "better") == WITHIN_NOISE
    assert expected(compare_samples([], [1.0]), "better") == WITHIN_NOISE


def test_the_printed_form_carries_the_verdict():
    assert str(Conclusion("A is faster.", SHOWN)) == "A is faster. [shown]"
    assert str(Conclusion("A note.")) == "A note." and Conclusion("x").verdict == INFO
    assert lines([Conclusion("one"), Conclusion("two", NOT_SHOWN)]) == "- one\n- two [not shown]"
