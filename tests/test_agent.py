"""The agent's context-tax conclusion, fed numbers both ways (the loop itself runs against the engine)."""

from helpers.evals.agent import conclude_context_growth
from helpers.core.conclusion import NOT_SHOWN, SHOWN


def test_growing_prompt_is_shown():
    c = conclude_context_growth([300, 420, 560, 700], [20, 15, 18, 22])
    assert c.verdict == SHOWN and "300 to 700 tokens (2.3x)" in c.text


def test_flat_prompt_is_not_shown():
    c = conclude_context_growth([300, 310, 305], [20, 15, 18])
    assert c.verdict == NOT_SHOWN and "grew less than 1.5x" in c.text


def test_one_call_is_not_enough():
    assert conclude_context_growth([300], [20]).verdict == NOT_SHOWN


def test_the_tool_tax_outcome_goes_both_ways():
    from helpers.evals.agent import tool_tax_outcome

    outcome, detail = tool_tax_outcome(20, 260, 4)
    assert outcome == "more" and "+240 tokens (+60 per tool)" in detail
    assert tool_tax_outcome(20, 20, 4)[0] == "about the same"
    assert tool_tax_outcome(200, 20, 4)[0] == "fewer"
