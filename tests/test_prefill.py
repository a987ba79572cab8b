"""Prefill against decode: the conclusion follows the numbers, both ways."""

import pandas as pd

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE
from helpers.lessons.l03.prefill import conclude_prefill_decode, prefill_table


def frame(short_ttft, long_ttft, short_tpot, long_tpot):
    rows = [{"target_tokens": 64, "repeat": i, "prompt_tokens": 64, "ttft_ms": t, "tpot_ms": p, "ok": True}
            for i, (t, p) in enumerate(zip(short_ttft, short_tpot))]
    rows += [{"target_tokens": 3500, "repeat": i, "prompt_tokens": 3500, "ttft_ms": t, "tpot_ms": p, "ok": True}
             for i, (t, p) in enumerate(zip(long_ttft, long_tpot))]
    return pd.DataFrame(rows)


def test_expected_case_shows_both():
    ttft, tpot = conclude_prefill_decode(frame([100, 110, 105], [3000, 3100, 3050], [20, 21, 20], [22, 23, 22]))
    assert ttft.verdict == SHOWN and "prefill does work in proportion" in ttft.text
    assert tpot.verdict == SHOWN


def test_tpot_that_doubles_is_not_shown_and_says_why():
    # the busy-machine run of the issue: TPOT 78 -> 144 ms
    _, tpot = conclude_prefill_decode(frame([100, 110, 105], [3000, 3100, 3050], [78, 79, 77], [144, 140, 146]),
                                      quiet=False)
    assert tpot.verdict == NOT_SHOWN
    assert "78.0 to 143.3 ms" in tpot.text and "the machine was busy" in tpot.text


def test_ttft_within_the_spread_is_within_noise():
    ttft, _ = conclude_prefill_decode(frame([100, 300, 200], [210, 190, 200], [20, 20, 20], [20, 20, 20]))
    assert ttft.verdict == WITHIN_NOISE


def test_ttft_that_shrinks_is_not_shown():
    ttft, _ = conclude_prefill_decode(frame([900, 910, 905], [300, 310, 305], [20, 20, 20], [20, 20, 20]))
    assert ttft.verdict == NOT_SHOWN and "served faster" in ttft.text


def test_prefill_table_means_and_rates():
    table = prefill_table(frame([100, 100], [1000, 1000], [20, 20], [25, 25]))
    assert list(table["mean_ttft_ms"]) == [100, 1000]
    assert table["prefill_tokens_per_s"].iloc[1] == 3500 and table["failed"].sum() == 0
