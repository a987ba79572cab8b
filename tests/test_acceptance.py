"""The expected accepted length of speculative decoding: the formula, and the formula against counters that go
both ways (independent guesses, a draft that sticks once right, one that fades)."""

import pandas as pd
import pytest

from helpers.planning.acceptance import expected_accepted_length, expected_length_table, more_guesses
from helpers.lessons.l06 import formula_conclusion, length_gain_outcome
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE


def test_the_formula_at_its_limits_and_a_known_value():
    assert expected_accepted_length(0.0, 5) == 1.0          # nothing accepted: the target's own token
    assert expected_accepted_length(1.0, 5) == 6.0          # everything accepted: k + 1
    assert expected_accepted_length(0.5, 1) == pytest.approx(1.5)
    assert expected_accepted_length(0.6, 3) == pytest.approx(1 + 0.6 + 0.36 + 0.216)
    with pytest.raises(ValueError, match="between 0 and 1"):
        expected_accepted_length(1.2, 3)


def spec_runs(rates_by_config, drafts=100, concurrency=1):
    return pd.DataFrame([{"config": c, "concurrency": concurrency, "spec_drafts": drafts, "per_position_acceptance": r}
                         for c, r in rates_by_config.items()])


def test_independent_guesses_match_the_formula_and_a_sticky_draft_beats_it():
    a = 0.6
    table = expected_length_table(spec_runs({"iid": [a, a * a, a ** 3], "sticky": [a, 0.55, 0.5], "k1": [a]}),
                                  {"iid": 3, "sticky": 3, "k1": 1}, 1).set_index("config")
    assert table.loc["iid", "measured_length"] == pytest.approx(table.loc["iid", "formula_length"])
    assert table.loc["k1", "difference"] == pytest.approx(0)
    assert table.loc["sticky", "difference"] > 0 and table.loc["sticky", "conditional"][1] == pytest.approx(0.917, abs=1e-3)
    iid_only = formula_conclusion(table.reset_index()[lambda t: t.config != "sticky"])
    assert iid_only.verdict == SHOWN
    both = formula_conclusion(table.reset_index())
    assert both.verdict == NOT_SHOWN and "not independent per position" in both.text and "(higher)" in both.text
    assert "formula under-counts" in both.text and "over-counts" not in both.text


def test_a_draft_that_falls_off_after_the_first_guess_reads_lower():
    table = expected_length_table(spec_runs({"fading": [0.8, 0.3, 0.05]}), {"fading": 3}, 1)
    verdict = formula_conclusion(table)
    assert table.difference.iloc[0] < 0 and verdict.verdict == NOT_SHOWN and "(lower)" in verdict.text
    # the reason follows the numbers: later positions kept less often, so the formula over-counts
    assert "formula over-counts" in verdict.text and "easy stretch" not in verdict.text


def test_runs_pool_by_drafts_and_no_k_above_one_tests_nothing():
    runs_ = pd.concat([spec_runs({"x": [1.0, 1.0]}, drafts=100), spec_runs({"x": [0.0, 0.0]}, drafts=300)])
    row = expected_length_table(runs_, {"x": 2}, 1).iloc[0]
    assert row.a_first_guess == pytest.approx(0.25) and row.drafts == 400
    assert formula_conclusion(expected_length_table(spec_runs({"k1": [0.5]}), {"k1": 1}, 1)).verdict == WITHIN_NOISE
    assert expected_length_table(spec_runs({"none": None}), {"none": 3}, 1).empty


def test_more_guesses_gain_less_and_less():
    gain, detail = more_guesses(0.6, 5, 8)
    assert 0 < gain < 0.25 and "1/(1-a) = 2.50" in detail and length_gain_outcome(gain) == "under 0.25 tokens"
    assert length_gain_outcome(more_guesses(0.95, 1, 8)[0]) == "over 1 token"


