"""Figures for the notebooks. Each function takes results and returns a Figure; none measures."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from helpers.stream_timing import StreamTiming


def token_timeline(timing: StreamTiming, title: str = "One streamed request") -> Figure:
    """Cumulative tokens against time since send, with TTFT marked; per-token gaps beneath."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=False, constrained_layout=True)
    times_ms = [t * 1000 for t in timing.token_times_s()]
    top.step(times_ms, range(1, len(times_ms) + 1), where="post")
    if timing.ttft_s is not None:
        top.axvline(timing.ttft_s * 1000, color="tab:red", linestyle="--", label=f"TTFT {timing.ttft_s * 1000:.0f} ms")
    top.set_xlabel("time since request sent (ms)")
    top.set_ylabel("output tokens received")
    top.set_title(title)
    top.legend(loc="lower right")
    gaps_ms = [g * 1000 for g in timing.itl_token_s]
    bottom.plot(range(2, len(gaps_ms) + 2), gaps_ms, marker=".", linewidth=0.8)
    if timing.tpot_s is not None:
        bottom.axhline(timing.tpot_s * 1000, color="tab:green", linestyle="--", label=f"TPOT {timing.tpot_s * 1000:.1f} ms")
        bottom.legend(loc="upper right")
    bottom.set_xlabel("output token number")
    bottom.set_ylabel("gap before token (ms)")
    return fig


def context_growth(trace: pd.DataFrame, title: str = "The context tax: every step resends the conversation") -> Figure:
    """Prompt and completion tokens of each model call in an agent run (stacked bars)."""
    fig, ax = plt.subplots(figsize=(7, 3.5), constrained_layout=True)
    labels = [str(s) for s in trace["step"]]
    ax.bar(labels, trace["prompt_tokens"], label="prompt tokens (re-sent each call)")
    ax.bar(labels, trace["completion_tokens"], bottom=trace["prompt_tokens"], label="completion tokens")
    ax.set_xlabel("model call")
    ax.set_ylabel("tokens")
    ax.set_title(title)
    ax.legend()
    return fig


def cost_bars(costs: pd.DataFrame, value: str = "usd_per_million_tokens", label: str = "option",
              title: str = "Cost per million tokens") -> Figure:
    """Horizontal bars of one cost column per option (log scale when values span decades)."""
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(costs)), constrained_layout=True)
    ax.barh(costs[label], costs[value])
    values = costs[value][costs[value] > 0]
    if len(values) and values.max() / values.min() > 50:
        ax.set_xscale("log")
    ax.set_xlabel(value.replace("_", " "))
    ax.set_title(title)
    return fig
