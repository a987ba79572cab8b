import pytest

from fakes import recorded_stream
from helpers.measure.stream_timing import StreamTiming


make = recorded_stream


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


# ---------------------------------------------------------------- gaps as they arrived

def test_chunk_gaps_keep_a_stall_as_one_gap():
    # five tokens at 20 ms, then one chunk of 4 tokens after a 1.26 s stall
    t = make([(0.1, 1, "a"), (0.12, 2, "b"), (0.14, 3, "c"), (0.16, 4, "d"), (0.18, 5, "e"), (1.44, 9, "fghi")])
    assert t.chunk_gaps()[-1] == (9, pytest.approx(1.26))
    assert t.longest_gap_s == pytest.approx(1.26) and t.median_gap_s == pytest.approx(0.02)
    assert max(t.itl_token_s) == pytest.approx(1.26 / 4)  # per token the stall reads as a slow pace
