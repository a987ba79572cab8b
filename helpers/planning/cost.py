"""Rent vs own: dollars per million tokens from an hourly price and a measured throughput.

Prices are always parameters: pass the figure you pay and keep its source next to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from helpers.core.conclusion import Conclusion

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


def usd_per_million_tokens(hourly_usd: float, tokens_per_s: float) -> float:
    """Cost in USD of one million tokens on a machine rented at ``hourly_usd`` producing ``tokens_per_s``."""
    if tokens_per_s <= 0:
        raise ValueError("tokens_per_s must be positive: measure a throughput first")
    return hourly_usd / (tokens_per_s * 3600.0) * 1e6


def api_cost_usd(prompt_tokens: int, completion_tokens: int, usd_per_m_input: float, usd_per_m_output: float) -> float:
    """What a pay-per-token API would charge, in USD, for the given token counts."""
    return (prompt_tokens * usd_per_m_input + completion_tokens * usd_per_m_output) / 1e6


def cached_prefix_tokens(prompt_tokens: Sequence[int], completion_tokens: Sequence[int],
                         min_prefix_tokens: int = 0) -> list[int]:
    """Prompt tokens of each call of one conversation that a warm prompt cache would bill as cached: the
    previous call's prompt and answer, which this call re-sends first, when at least ``min_prefix_tokens``."""
    if len(prompt_tokens) != len(completion_tokens):
        raise ValueError("need one completion count per prompt")
    cached = [0]
    for i in range(1, len(prompt_tokens)):
        prefix = min(prompt_tokens[i], prompt_tokens[i - 1] + completion_tokens[i - 1])
        cached.append(prefix if prefix >= min_prefix_tokens else 0)
    return cached[:len(prompt_tokens)]


def api_cost_cached_usd(prompt_tokens: int, cached_tokens: int, completion_tokens: int, usd_per_m_input: float,
                        usd_per_m_cached_input: float, usd_per_m_output: float) -> float:
    """What an API charges in USD when ``cached_tokens`` of the ``prompt_tokens`` are billed at the cached price."""
    if not 0 <= cached_tokens <= prompt_tokens:
        raise ValueError("cached_tokens must be between 0 and prompt_tokens")
    return ((prompt_tokens - cached_tokens) * usd_per_m_input + cached_tokens * usd_per_m_cached_input
            + completion_tokens * usd_per_m_output) / 1e6


def api_usd_per_million_output_tokens(prompt_tokens: int, completion_tokens: int, usd_per_m_input: float,
                                      usd_per_m_output: float) -> float:
    """What an API charges per million OUTPUT tokens for requests of this shape, prompts included (USD)."""
    if completion_tokens <= 0:
        raise ValueError("completion_tokens must be positive")
    return api_cost_usd(prompt_tokens, completion_tokens, usd_per_m_input, usd_per_m_output) / completion_tokens * 1e6


def own_usd_per_million_output_tokens(hourly_usd: float, busy_s: float, completion_tokens: int) -> float:
    """What a machine rented at ``hourly_usd`` costs per million OUTPUT tokens when serving them kept it busy
    ``busy_s`` seconds (prefill of the prompts included), in USD: the same unit as
    ``api_usd_per_million_output_tokens``."""
    if completion_tokens <= 0 or busy_s <= 0:
        raise ValueError("need completion_tokens > 0 and a measured busy_s > 0")
    return hourly_usd * busy_s / 3600.0 / completion_tokens * 1e6


def break_even_tokens_per_day(hourly_usd: float, api_usd_per_m_tokens: float) -> float:
    """Tokens per day above which renting a machine all day at ``hourly_usd`` costs less than the API."""
    if api_usd_per_m_tokens <= 0:
        raise ValueError("api_usd_per_m_tokens must be positive: pass the API's price per million tokens")
    return hourly_usd * 24.0 / api_usd_per_m_tokens * 1e6


def break_even_utilization(hourly_usd: float, api_usd_per_m_tokens: float, tokens_per_s: float) -> float:
    """Share of a day the machine must run at ``tokens_per_s`` to break even; above 1 it never does."""
    if tokens_per_s <= 0:
        raise ValueError("tokens_per_s must be positive: measure a throughput first")
    return break_even_tokens_per_day(hourly_usd, api_usd_per_m_tokens) / (tokens_per_s * 86400.0)


@dataclass(frozen=True)
class SweepPoint:
    """One point of a concurrency sweep: total output tokens/s and the per-user time per output token."""

    concurrency: int
    output_tokens_per_s: float
    tpot_s: float


def _field(point: Any, name: str) -> Any:
    return point[name] if isinstance(point, Mapping) else getattr(point, name)


def price_latency_frame(points: Iterable[Any], hourly_usd: float) -> "pd.DataFrame":
    """USD per million output tokens against per-user latency, one row per sweep point (by concurrency).

    ``points``: SweepPoints, or mappings / objects with ``concurrency``, ``output_tokens_per_s``, ``tpot_s``.
    """
    import pandas as pd

    rows = []
    for p in points:
        tokens_per_s, tpot_s = float(_field(p, "output_tokens_per_s")), float(_field(p, "tpot_s"))
        if tpot_s <= 0:
            raise ValueError(f"tpot_s must be positive, got {tpot_s} at concurrency {_field(p, 'concurrency')}")
        rows.append({
            "concurrency": int(_field(p, "concurrency")),
            "output_tokens_per_s": tokens_per_s,
            "tpot_s": tpot_s,
            "tpot_ms": tpot_s * 1e3,
            "user_tokens_per_s": 1.0 / tpot_s,
            "usd_per_million_tokens": usd_per_million_tokens(hourly_usd, tokens_per_s),
        })
    if not rows:
        raise ValueError("no sweep points: run a concurrency sweep first")
    return pd.DataFrame(rows).sort_values("concurrency").reset_index(drop=True)


def plot_price_latency(frame: "pd.DataFrame", api_usd_per_m_tokens: float | None = None,
                       label: str = "self-hosted") -> "Figure":
    """Cost per million tokens against per-user TPOT (ms), each point labelled with its concurrency."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    ax.plot(frame["tpot_ms"], frame["usd_per_million_tokens"], marker="o", label=label)
    for _, row in frame.iterrows():
        ax.annotate(f"c={int(row['concurrency'])}", (row["tpot_ms"], row["usd_per_million_tokens"]),
                    textcoords="offset points", xytext=(4, 4))
    if api_usd_per_m_tokens is not None:
        ax.axhline(api_usd_per_m_tokens, color="grey", linestyle="--", label=f"API ${api_usd_per_m_tokens:g}/M")
    ax.set_yscale("log")
    ax.set_xlabel("time per output token per user (ms)")
    ax.set_ylabel("USD per million output tokens")
    ax.legend()
    return fig


def reasoning_cost(answer_tokens: int, reasoning_tokens: int, tpot_s: float, usd_per_m_output: float) -> dict[str, float]:
    """What a "thinking" mode adds to one answer: decode seconds and output dollars, without and with it.

    Reasoning tokens are decoded (and billed as output) like the answer's, so both scale with
    ``answer_tokens + reasoning_tokens``; ``tpot_s`` is a measured time per output token.
    """
    if answer_tokens < 1 or reasoning_tokens < 0 or tpot_s <= 0:
        raise ValueError("need answer_tokens >= 1, reasoning_tokens >= 0 and a measured tpot_s > 0")
    total = answer_tokens + reasoning_tokens
    return {"answer_tokens": answer_tokens, "reasoning_tokens": reasoning_tokens,
            "decode_s_plain": answer_tokens * tpot_s, "decode_s_thinking": total * tpot_s,
            "usd_plain": answer_tokens * usd_per_m_output / 1e6, "usd_thinking": total * usd_per_m_output / 1e6,
            "factor": total / answer_tokens}


def conclude_reasoning_cost(thinking: Mapping[str, float], tpot_source: str) -> Conclusion:
    """The sentence for ``reasoning_cost``'s result; ``tpot_source`` says where its TPOT was measured."""
    return Conclusion(
        f"Thinking: {thinking['reasoning_tokens']:,.0f} reasoning tokens make a {thinking['answer_tokens']:,.0f}-token "
        f"answer {thinking['factor']:.1f}x slower to decode ({thinking['decode_s_plain']:.3f} s -> "
        f"{thinking['decode_s_thinking']:.3f} s at the TPOT of {tpot_source}) and {thinking['factor']:.1f}x dearer "
        "in output tokens (a computation from the measured TPOT, not a measured reasoning run).")
