"""Cost: dollars per million tokens, break-even against an API, price against latency."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from helpers.planning import cost


def test_usd_per_million_tokens_and_api_cost() -> None:
    assert cost.usd_per_million_tokens(3.6, 1000.0) == pytest.approx(1.0)
    assert cost.api_cost_usd(1_000_000, 500_000, 0.5, 2.0) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="measure a throughput"):
        cost.usd_per_million_tokens(1.0, 0.0)


def test_api_price_per_output_token_includes_prompts() -> None:
    # 1000-token prompts at $0.50/M and 100-token answers at $2/M: $0.0007 per request, $7 per M output tokens.
    assert cost.api_usd_per_million_output_tokens(1000, 100, 0.5, 2.0) == pytest.approx(7.0)


def test_break_even() -> None:
    assert cost.break_even_tokens_per_day(2.0, 0.5) == pytest.approx(96_000_000)
    # 1000 tok/s all day makes 86.4M tokens: the machine must be busy 96/86.4 of the day: never breaks even.
    assert cost.break_even_utilization(2.0, 0.5, 1000.0) == pytest.approx(96 / 86.4)
    assert cost.break_even_utilization(2.0, 0.5, 4000.0) == pytest.approx(96 / 345.6)
    with pytest.raises(ValueError, match="price"):
        cost.break_even_tokens_per_day(2.0, 0.0)


def test_price_latency_frame_and_plot() -> None:
    points = [cost.SweepPoint(8, 800.0, 0.010), {"concurrency": 1, "output_tokens_per_s": 100.0, "tpot_s": 0.008}]
    frame = cost.price_latency_frame(points, hourly_usd=3.6)
    assert list(frame["concurrency"]) == [1, 8]
    assert list(frame["usd_per_million_tokens"]) == pytest.approx([10.0, 1.25])
    assert list(frame["tpot_ms"]) == pytest.approx([8.0, 10.0])
    assert list(frame["user_tokens_per_s"]) == pytest.approx([125.0, 100.0])
    fig = cost.plot_price_latency(frame, api_usd_per_m_tokens=2.0)
    assert len(fig.axes[0].lines) == 2  # the sweep and the API price
    plt.close(fig)
    with pytest.raises(ValueError, match="sweep"):
        cost.price_latency_frame([], 1.0)


def test_reasoning_cost_scales_with_all_decoded_tokens():
    from helpers.planning.cost import reasoning_cost

    r = reasoning_cost(answer_tokens=200, reasoning_tokens=1800, tpot_s=0.02, usd_per_m_output=10.0)
    assert r["factor"] == 10.0
    assert r["decode_s_plain"] == pytest.approx(4.0) and r["decode_s_thinking"] == pytest.approx(40.0)
    assert r["usd_thinking"] == pytest.approx(2000 * 10 / 1e6)
    with pytest.raises(ValueError, match="tpot_s"):
        reasoning_cost(200, 100, 0.0, 1.0)


def test_own_cost_per_output_token_counts_the_busy_time() -> None:
    # 10 s busy at 3.6 USD/h = 0.01 USD for 1000 output tokens -> 10 USD per million output tokens
    assert cost.own_usd_per_million_output_tokens(3.6, 10.0, 1000) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        cost.own_usd_per_million_output_tokens(3.6, 0.0, 1000)


def test_reasoning_cost_sentence_has_its_numbers() -> None:
    c = cost.conclude_reasoning_cost(cost.reasoning_cost(200, 1500, 0.01, 0.6), "the dense model")
    assert "8.5x slower" in c.text and "2.000 s -> 17.000 s" in c.text


def test_cached_prefix_tokens_and_the_cached_price() -> None:
    assert cost.cached_prefix_tokens([100, 220, 400], [20, 30, 10]) == [0, 120, 250]
    assert cost.cached_prefix_tokens([100, 220, 400], [20, 30, 10], min_prefix_tokens=200) == [0, 0, 250]
    assert cost.cached_prefix_tokens([], []) == []
    with pytest.raises(ValueError, match="one completion count"):
        cost.cached_prefix_tokens([1, 2], [1])
    full = cost.api_cost_cached_usd(1_000_000, 0, 0, 0.4, 0.1, 1.6)
    half = cost.api_cost_cached_usd(1_000_000, 500_000, 0, 0.4, 0.1, 1.6)
    assert full == pytest.approx(0.4) and half == pytest.approx(0.25)
    with pytest.raises(ValueError, match="between 0 and prompt_tokens"):
        cost.api_cost_cached_usd(10, 11, 0, 0.4, 0.1, 1.6)
