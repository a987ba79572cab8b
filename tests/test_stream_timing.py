import pytest

from helpers.measure.stream_timing import StreamTiming


def make(events):
    t = StreamTiming(t_sent=0.0)
    for ev in events:
        t.record_chunk(*ev)
    t.t_done = events[-1][0]
    return t


def test_role_chunk_is_not_a_token_and_multi_token_chunks_are_spread():
    # role-only chunk at 0.05 s, first token 0.10, a 3-token chunk at 0.40, a token at 0.50
    t = make([(0.05, 0, ""), (0.10, 1, "a"), (0.40, 4, "bcd"), (0.50, 5, "e"), (0.51, 5, "")])
    assert t.t_first_byte == 0.05
    assert t.ttft_s == pytest.approx(0.10)
    assert t.completion_tokens == 5
    assert t.tpot_s == pytest.approx((0.50 - 0.10) / 4)
    assert t.itl_chunk_s == pytest.approx([0.30, 0.10])
    assert t.itl_token_s == pytest.approx([0.10, 0.10, 0.10, 0.10])
    assert len(t.token_times_s()) == 5


def test_ttft_counts_tool_call_and_reasoning_channels_ttfot_only_content():
    t = make([(0.2, 1, "", "get_weather"), (0.3, 2, "", '{"city"'), (0.9, 3, "Hi")])
    assert t.ttft_s == pytest.approx(0.2)
    assert t.ttfot_s == pytest.approx(0.9)


def test_without_usage_each_nonempty_chunk_is_one_token():
    t = make([(0.1, None, "a"), (0.2, None, "b"), (0.3, None, "")])
    assert t.completion_tokens == 2


def test_failed_request_has_no_latency():
    t = StreamTiming(t_sent=0.0, error="ConnectionError: refused")
    assert not t.ok and t.ttft_s is None and t.tpot_s is None


# ---------------------------------------------------------------- gaps as they arrived, and the conclusion

from helpers.core.conclusion import NOT_SHOWN, SHOWN  # noqa: E402
from helpers.measure.stream_timing import conclude_stream  # noqa: E402


def steady(n=20, gap=0.02):
    return make([(0.1 + i * gap, i + 1, "x") for i in range(n)])


def test_chunk_gaps_keep_a_stall_as_one_gap():
    # five tokens at 20 ms, then one chunk of 4 tokens after a 1.26 s stall
    t = make([(0.1, 1, "a"), (0.12, 2, "b"), (0.14, 3, "c"), (0.16, 4, "d"), (0.18, 5, "e"), (1.44, 9, "fghi")])
    assert t.chunk_gaps()[-1] == (9, pytest.approx(1.26))
    assert t.longest_gap_s == pytest.approx(1.26) and t.median_gap_s == pytest.approx(0.02)
    assert max(t.itl_token_s) == pytest.approx(1.26 / 4)  # per token the stall reads as a slow pace


def test_steady_stream_is_shown():
    out = conclude_stream(steady())
    assert out[1].verdict == SHOWN and "longest of 20.0 ms" in out[1].text


def test_a_stall_flips_the_verdict_and_is_named():
    events = [(0.1 + i * 0.02, i + 1, "x") for i in range(19)] + [(0.1 + 18 * 0.02 + 1.26, 20, "y")]
    out = conclude_stream(make(events))
    assert out[1].verdict == NOT_SHOWN
    assert "one gap of 1,260 ms before token 20" in out[1].text and "a stall" in out[1].text


def test_too_few_tokens_is_not_shown():
    assert conclude_stream(make([(0.1, 1, "a")]))[0].verdict == NOT_SHOWN


def _length_rows(ttft_short, ttft_long, total_short, total_long):
    return [{"max_tokens": n, "round": r, "ttft_s": ttft, "e2e_s": total, "completion_tokens": n}
            for r in (1, 2) for n, ttft, total in ((32, ttft_short, total_short), (64, ttft_long, total_long))]


@pytest.mark.parametrize("times, outcome", [
    ((0.02, 0.021, 0.5, 1.0), "only the total time grows"),
    ((0.02, 0.05, 0.5, 1.0), "both grow"),
    ((0.02, 0.05, 0.5, 0.52), "only TTFT grows"),
    ((0.02, 0.02, 0.5, 0.5), "neither grows"),
])
def test_the_longer_answer_outcome_follows_the_medians_either_way(times, outcome):
    from helpers.measure.stream_timing import LENGTH_CHOICES, length_outcome

    got, detail = length_outcome(_length_rows(*times))
    assert got == outcome and got in LENGTH_CHOICES
    assert "max_tokens 32 -> 64" in detail and "medians of 2 rounds" in detail
