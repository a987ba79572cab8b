"""The scaffolding's checks: "what you should see" and the exercises' predictions."""

import numpy as np
import pytest

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion
from helpers.core.lesson import (NOT_SEEN, SEEN, UNDECIDED, check_prediction, ratio_outcome, should_see, should_see_conclusion,
                                 show_conclusions)


@pytest.mark.parametrize("seen, outcome", [(True, SEEN), (np.bool_(False), NOT_SEEN), (None, UNDECIDED),
                                           (SHOWN, SEEN), (NOT_SHOWN, NOT_SEEN), (WITHIN_NOISE, UNDECIDED)])
def test_should_see_prints_the_claim_and_what_this_run_showed(capsys, seen, outcome):
    check = should_see("TTFT grows with the prompt.", seen, "64 -> 2,048 tokens: 40 -> 900 ms")
    out = capsys.readouterr().out
    assert check.outcome == outcome
    assert out.startswith("What you should see: TTFT grows with the prompt\n") and "900 ms" in out
    assert {SEEN: "✔", NOT_SEEN: "✘", UNDECIDED: "~"}[outcome] in out


def test_should_see_refuses_a_verdict_it_does_not_know():
    with pytest.raises(ValueError, match="lesson verdict"):
        should_see("x", "maybe")


def test_should_see_conclusion_takes_the_verdict_and_sentence():
    check = should_see_conclusion("fp8 KV doubles the tokens", Conclusion("2.0x the tokens", NOT_SHOWN), show=False)
    assert (check.outcome, check.detail) == (NOT_SEEN, "2.0x the tokens")


def test_show_conclusions_checks_each_against_its_own_expectation_in_order(capsys):
    checks = show_conclusions([Conclusion("TTFT grew 4x", SHOWN, "TTFT grows with the prompt"),
                               Conclusion("TPOT moved 2%", WITHIN_NOISE, "TPOT stays flat")])
    assert [(c.claim, c.outcome) for c in checks] == [("TTFT grows with the prompt", SEEN),
                                                        ("TPOT stays flat", UNDECIDED)]
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and "TTFT grows with the prompt" in printed[0] and "TPOT moved 2%" in printed[3]
    assert show_conclusions([]) == []


def test_a_prediction_is_checked_against_the_run(capsys):
    choices = ["lower", "about the same", "higher"]
    right = check_prediction(" Higher ", "higher", choices, "TTFT 2.1x")
    wrong = check_prediction("lower", "higher", choices)
    assert (right.prediction, right.right) == ("higher", True) and wrong.right is False
    assert "right." in capsys.readouterr().out


def test_no_prediction_and_an_unknown_one_say_what_to_do(capsys):
    choices = ["lower", "higher"]
    none = check_prediction(None, "lower", choices)
    typo = check_prediction("hihger", "lower", choices)
    out = capsys.readouterr().out
    assert none.right is None and typo.right is None
    assert "set MY_PREDICTION before running" in out and "not one of the choices" in out and "lower, higher" in out


def test_an_outcome_outside_the_choices_is_a_programming_error():
    with pytest.raises(ValueError, match="not one of the choices"):
        check_prediction("a", "c", ["a", "b"])


@pytest.mark.parametrize("before, after, word", [(100, 110, "about the same"), (100, 200, "higher"),
                                                 (100, 50, "lower"), (0, 0, "about the same"), (0, 3, "higher")])
def test_ratio_outcome(before, after, word):
    assert ratio_outcome(before, after) == word
