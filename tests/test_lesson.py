"""The scaffolding's checks: "what you should see" and the exercises' predictions."""

import numpy as np
import pytest

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion
from helpers.core.lesson import (CI_PREDICTION_ENV, NOT_SEEN, SEEN, UNDECIDED, check_exercise, check_prediction,
                                 ratio_outcome, should_see, should_see_conclusion, show_conclusions)


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


def test_no_prediction_asks_for_one_and_shows_no_answer(capsys, monkeypatch):
    monkeypatch.delenv(CI_PREDICTION_ENV, raising=False)
    none = check_prediction(None, "lower", ["lower", "higher"], "TTFT 0.4x")
    out = capsys.readouterr().out
    assert none.right is None and "Your turn: set MY_PREDICTION" in out
    assert "lower" not in out and "0.4x" not in out and "This run" not in out  # nothing of the answer


def test_an_unknown_prediction_says_what_to_do(capsys, monkeypatch):
    monkeypatch.delenv(CI_PREDICTION_ENV, raising=False)
    typo = check_prediction("hihger", "lower", ["lower", "higher"])
    out = capsys.readouterr().out
    assert typo.right is None and "not one of the choices" in out and "lower, higher" in out


@pytest.mark.parametrize("value, made", [("first", "lower"), ("last", "higher"), ("1", "higher")])
def test_a_test_run_makes_the_prediction_and_says_so(capsys, monkeypatch, value, made):
    monkeypatch.setenv(CI_PREDICTION_ENV, value)
    result = check_prediction(None, "lower", ["lower", "higher"])
    out = capsys.readouterr().out
    assert result.prediction == made and result.right is (made == "lower")
    assert "(made by the test run)" in out and "This run: lower." in out
    assert check_prediction("higher", "lower", ["lower", "higher"], show=False).by == ""  # the attendee's own wins


def test_a_ci_prediction_that_is_no_choice_is_refused(monkeypatch):
    monkeypatch.setenv(CI_PREDICTION_ENV, "middle")
    with pytest.raises(ValueError, match="first, last or a choice's index"):
        check_prediction(None, "a", ["a", "b"])


def _tpot_check(answer):
    return None if abs(answer - 0.02) < 1e-9 else f"{answer} s is not (1.5 s - 0.5 s) / 50 tokens."


def test_a_code_exercise_not_answered_prints_the_hint_and_does_not_fail(capsys):
    result = check_exercise("TPOT", None, _tpot_check, "decode time over decoded tokens")
    assert not result.answered and "replace the None" in capsys.readouterr().out


def test_a_code_exercise_right_passes_and_wrong_fails_with_what_is_wrong(capsys):
    assert check_exercise("TPOT", 1.0 / 50, _tpot_check, "h", explain="20 ms").answered
    assert "✔ TPOT: right. 20 ms" in capsys.readouterr().out
    with pytest.raises(AssertionError, match=r"TPOT: 0\.03 s is not .* Hint: decode time"):
        check_exercise("TPOT", 0.03, _tpot_check, "decode time over decoded tokens")


def test_an_outcome_outside_the_choices_is_a_programming_error():
    with pytest.raises(ValueError, match="not one of the choices"):
        check_prediction("a", "c", ["a", "b"])


@pytest.mark.parametrize("before, after, word", [(100, 110, "about the same"), (100, 200, "higher"),
                                                 (100, 50, "lower"), (0, 0, "about the same"), (0, 3, "higher")])
def test_ratio_outcome(before, after, word):
    assert ratio_outcome(before, after) == word
