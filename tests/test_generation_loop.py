"""The hand-written loops' conclusion, fed made-up step times both ways."""

import pandas as pd

from helpers.core.conclusion import NOT_SHOWN, SHOWN
from helpers.lessons.l03.generation_loop import conclude_loops


def steps(with_s, without_s, tokens_with=(1, 2, 3), tokens_without=(1, 2, 3)):
    rows = [{"cache": "with KV cache", "step_s": s, "token": t} for s, t in zip(with_s, tokens_with)]
    rows += [{"cache": "without", "step_s": s, "token": t} for s, t in zip(without_s, tokens_without)]
    return pd.DataFrame(rows)


def test_cache_faster_and_same_tokens_is_shown():
    same, faster = conclude_loops(steps([0.01] * 3, [0.02, 0.03, 0.04]), 3)
    assert same.verdict == SHOWN and faster.verdict == SHOWN and "40.0 ms vs 10.0 ms" in faster.text


def test_no_saving_or_different_tokens_is_not_shown():
    same, faster = conclude_loops(steps([0.05] * 3, [0.01] * 3, tokens_without=(1, 2, 4)), 3)
    assert same.verdict == NOT_SHOWN and faster.verdict == NOT_SHOWN


def test_loop_summary_says_whether_the_tokens_match():
    from helpers.lessons.l03.generation_loop import loop_summary

    same, table = loop_summary(steps([0.01, 0.01, 0.01], [0.02, 0.03, 0.04]))
    assert same and table.loc["without", "last_step_ms"] == 40.0 and table.loc["with KV cache", "total_s"] == 0.03
    different, _ = loop_summary(steps([0.01] * 3, [0.01] * 3, tokens_without=(1, 2, 4)))
    assert not different
