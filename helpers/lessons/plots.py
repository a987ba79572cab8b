"""Figures for the notebooks. Each function takes results and returns a Figure; none measures."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from helpers.measure.stream_timing import StreamTiming


def token_timeline(timing: StreamTiming, title: str = "One streamed request") -> Figure:
    """Cumulative tokens against time since send, with TTFT marked; beneath, the gap before each chunk
    as it arrived (ms; a stall stays one long gap, it is not spread over the chunk's tokens)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=False, constrained_layout=True)
    times_ms = [t * 1000 for t in timing.token_times_s()]
    top.step(times_ms, range(1, len(times_ms) + 1), where="post")
    if timing.ttft_s is not None:
        top.axvline(timing.ttft_s * 1000, color="tab:red", linestyle="--", label=f"TTFT {timing.ttft_s * 1000:.0f} ms")
    top.set_xlabel("time since request sent (ms)")
    top.set_ylabel("output tokens received")
    top.set_title(title)
    top.legend(loc="lower right")
    gaps = timing.chunk_gaps()
    bottom.bar([n for n, _ in gaps], [g * 1000 for _, g in gaps], width=0.8)
    if timing.median_gap_s is not None:
        bottom.axhline(timing.median_gap_s * 1000, color="tab:green", linestyle="--",
                       label=f"median gap {timing.median_gap_s * 1000:.1f} ms")
    if timing.tpot_s is not None:
        bottom.axhline(timing.tpot_s * 1000, color="tab:orange", linestyle=":",
                       label=f"TPOT (mean) {timing.tpot_s * 1000:.1f} ms")
    if gaps:
        bottom.legend(loc="best")  # where the bars are not: a stall's tall bar is often at the right
    bottom.set_xlabel("output token number (a chunk is drawn at its last token)")
    bottom.set_ylabel("gap before the chunk (ms)")
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


# ---------------------------------------------------------------- load sweeps (helpers/measure/loadgen.py, bench_results.py)

def _sweep_x(table: pd.DataFrame, x: str | None) -> str:
    if x is not None:
        return x
    return "concurrency" if "concurrency" in table and table["concurrency"].notna().all() else "request_rate"


def _log2_x_if_wide(ax, values: pd.Series) -> None:
    """A base-2 log x axis when the loads span a factor of 8 or more (1, 8, 32, 64 ...)."""
    if values.min() > 0 and values.max() / values.min() >= 8:
        ax.set_xscale("log", base=2)


def throughput_vs_load(table: pd.DataFrame, x: str | None = None, knee: float | None = None,
                       title: str = "Throughput as load grows") -> Figure:
    """Output tokens/s (left) and requests/s (right) per run of a sweep; the knee marked when given."""
    x = _sweep_x(table, x)
    data = table.sort_values(x)
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    ax.plot(data[x], data["output_throughput"], marker="o", color="tab:blue", label="output tokens/s")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel("output tokens/s", color="tab:blue")
    _log2_x_if_wide(ax, data[x])
    right = ax.twinx()
    right.plot(data[x], data["request_throughput"], marker="s", linestyle="--", color="tab:orange", label="requests/s")
    right.set_ylabel("requests/s", color="tab:orange")
    ax.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    if knee is not None:
        ax.axvline(knee, color="tab:red", linestyle=":", label=f"knee at {knee:g}")
    lines, more = ax.get_legend_handles_labels(), right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
    ax.set_title(title)
    return fig


def latency_vs_load(table: pd.DataFrame, x: str | None = None,
                    title: str = "Latency as load grows (median and p99)") -> Figure:
    """TTFT (left panel) and TPOT (right panel), median and p99 in ms, per run of a sweep."""
    x = _sweep_x(table, x)
    data = table.sort_values(x)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for ax, metric in zip(axes, ("ttft", "tpot")):
        for stat, style in (("median", "-"), ("p99", "--")):
            col = f"{stat}_{metric}_ms"
            if col in data:
                ax.plot(data[x], data[col], marker="o", linestyle=style, label=f"{stat}")
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(f"{metric.upper()} (ms)")
        _log2_x_if_wide(ax, data[x])
        ax.legend()
    fig.suptitle(title)
    return fig


def pareto_user_vs_total(table: pd.DataFrame, x: str | None = None,
                         title: str = "Per-user speed against total throughput") -> Figure:
    """Median tokens/s each user sees against total output tokens/s, one point per run, labelled by load."""
    x = _sweep_x(table, x)
    data = table.sort_values(x)
    fig, ax = plt.subplots(figsize=(6, 4.5), constrained_layout=True)
    ax.plot(data["output_throughput"], data["median_tokens_per_s_per_user"], marker="o")
    for _, row in data.iterrows():
        ax.annotate(f"{row[x]:g}", (row["output_throughput"], row["median_tokens_per_s_per_user"]),
                    textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel("total output tokens/s (all users)")
    ax.set_ylabel("tokens/s per user (median, 1/TPOT)")
    ax.set_title(title + f" (labels: {x.replace('_', ' ')})")
    return fig


def server_timeseries(gauges: pd.DataFrame, title: str = "Server state during the run",
                      kv_full_scale: bool = True, legend_outside: bool = False) -> Figure:
    """KV-cache usage (fraction, left) and running / waiting requests (right) against time in s.

    ``kv_full_scale=False`` zooms the KV axis onto the data (one request in a large cache uses ~1%);
    ``legend_outside=True`` puts the legend right of the plot (a zoomed KV line runs along its top)."""
    t = gauges["t_s"] if "t_s" in gauges else gauges["t"] - gauges["t"].iloc[0]
    fig, ax = plt.subplots(figsize=(8, 3.5), constrained_layout=True)
    ax.plot(t, gauges["kv_cache_usage"], color="tab:purple", label="KV cache used (fraction)")
    if kv_full_scale:
        ax.set_ylim(0, 1.05)
    else:
        ax.set_ylim(0, max(float(gauges["kv_cache_usage"].max()) * 1.2, 1e-6))
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel("KV cache used (0..1)", color="tab:purple")
    right = ax.twinx()
    right.step(t, gauges["num_requests_running"], where="post", color="tab:green", label="running")
    right.step(t, gauges["num_requests_waiting"], where="post", color="tab:red", label="waiting")
    right.set_ylabel("requests")
    right.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    if legend_outside:
        ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", bbox_to_anchor=(1.12, 1))
    else:
        ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
    ax.set_title(title)
    return fig


MAX_REQUEST_MARKS = 100  # more ticks than this in one bar would read as a grey band


def memory_budget(rows: pd.DataFrame, label: str = "gpu", title: str = "Where the GPU's memory goes") -> Figure:
    """Stacked bars of weights, overhead and KV cache (GiB) per row of ``memory.plan_row`` output, with the
    memory the driver reports and the budget marked, and a tick in the KV cache after each request of
    max_model_len tokens it holds; the legend sits below the axes, a title about a plan that does not fit in red."""
    fig, ax = plt.subplots(figsize=(9, 1.9 + 0.5 * len(rows)), layout="constrained")
    names = [str(x) for x in rows[label]]
    left = pd.Series(0.0, index=rows.index)
    for column, name in (("weights_gib", "weights"), ("overhead_gib", "overhead (estimate)"),
                         ("kv_cache_gib", "KV cache")):
        if column in rows:
            ax.barh(names, rows[column], left=left, label=name)
            left = left + rows[column]
    for column, name, color in (("memory_gib", "memory the driver reports", "grey"),
                                ("budget_gib", "x gpu-memory-utilization", "black")):
        if column in rows:
            ax.vlines(rows[column], [i - 0.45 for i in range(len(rows))], [i + 0.45 for i in range(len(rows))],
                      color=color, linewidth=2, label=name)
    marked = False
    for i, row in enumerate(rows.to_dict("records")):
        count, concurrency = row.get("requests_at_max_len", 0), row.get("max_concurrency_at_max_len", 0)
        if not count or not concurrency or count > MAX_REQUEST_MARKS:
            continue
        kv_start = row["weights_gib"] + row.get("overhead_gib", 0.0)
        per_request = row["kv_cache_gib"] / concurrency
        ax.vlines([kv_start + k * per_request for k in range(1, count + 1)], i - 0.4, i + 0.4, color="white",
                  linewidth=1.2, label=None if marked else "end of each max_model_len request")
        marked = True
    ax.set_xlabel("GiB (2**30 bytes, as nvidia-smi and vLLM count)")
    ax.set_title(textwrap.fill(title, 90), fontsize="medium",
                 color="tab:red" if "fits" in rows and not rows["fits"].all() else "black")
    fig.legend(loc="outside lower center", ncols=3, fontsize="small", facecolor="lightgrey")
    return fig


def prefill_decode(table: pd.DataFrame) -> Figure:
    """TTFT (ms) against prompt tokens, and TPOT (ms) against the context the decode ran in."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5), constrained_layout=True)
    left.plot(table["prompt_tokens"], table["mean_ttft_ms"], marker="o")
    left.set_xlabel("prompt tokens")
    left.set_ylabel("mean TTFT (ms)")
    left.set_title("Prefill: time to first token grows with the prompt")
    right.plot(table["prompt_tokens"], table["mean_tpot_ms"], marker="o", color="tab:orange")
    right.set_xlabel("context tokens when decoding starts")
    right.set_ylabel("mean TPOT (ms per token)")
    right.set_ylim(bottom=0)
    right.set_title("Decode: each token re-reads the weights and the KV cache")
    return fig


def generation_steps(steps: pd.DataFrame) -> Figure:
    """Per-step time (ms) against context tokens, one line per loop (``cache`` column)."""
    fig, ax = plt.subplots(figsize=(8, 3.5), constrained_layout=True)
    for name, part in steps.groupby("cache"):
        ax.plot(part["context_tokens"], part["step_s"] * 1000, marker=".", linestyle="", label=name)
    ax.set_xlabel("context tokens")
    ax.set_ylabel("time of one generation step (ms)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("Without a KV cache every step re-reads the whole context")
    return fig


def prefill_stall(gaps: pd.DataFrame, label: str = "config") -> Figure:
    """Inter-token gaps (ms) of running streams around a long prefill at t=0, one panel per ``label``."""
    names = list(dict.fromkeys(gaps[label]))
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.5), sharey=True, squeeze=False,
                             constrained_layout=True)
    for ax, name in zip(axes[0], names):
        part = gaps[gaps[label] == name]
        calm, hit = part[~part["during_prefill"]], part[part["during_prefill"]]
        ax.scatter(calm["t_s"], calm["gap_ms"], s=6, label="other gaps")
        ax.scatter(hit["t_s"], hit["gap_ms"], s=12, color="tab:red", label="overlapping the long prefill")
        ax.axvline(0, color="gray", linestyle=":")
        ax.set_xlabel("time since the long prompt was sent (s)")
        ax.set_title(str(name))
    axes[0][0].set_ylabel("gap between tokens of a running stream (ms)")
    axes[0][0].legend(fontsize="small")
    return fig


def scorecard_tradeoff(table: pd.DataFrame, speed: str, quality: str = "all_pass_rate",
                       label: str = "config") -> Figure:
    """One point per configuration: ``speed`` (x, e.g. c8_output_tok_s) against ``quality`` (y, 0..1),
    with the 95% interval when ``<category>_ci_low/_ci_high`` columns are present."""
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    low, high = quality.replace("_pass_rate", "_ci_low"), quality.replace("_pass_rate", "_ci_high")
    for _, row in table.iterrows():
        err = None
        if low in table and high in table:
            err = [[row[quality] - row[low]], [row[high] - row[quality]]]
        ax.errorbar(row[speed], row[quality], yerr=err, marker="o", capsize=3)
        ax.annotate(str(row[label]), (row[speed], row[quality]), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel(speed.replace("_", " "))
    ax.set_ylabel(quality.replace("_", " ") + " (95% CI)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Speed against quality, one point per configuration")
    return fig


def speculation_bars(table: pd.DataFrame) -> Figure:
    """Per configuration and concurrency: output tokens/s (left) and acceptance rate (right, 0..1)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    wide = table.pivot(index="config", columns="concurrency", values="output_tok_s")
    wide.plot.barh(ax=left)
    left.set_xlabel("output tokens/s")
    left.legend(title="concurrency")
    acc = table.pivot(index="config", columns="concurrency", values="acceptance_rate").fillna(0)
    acc.plot.barh(ax=right, legend=False)
    right.set_xlim(0, 1)
    right.set_xlabel("draft tokens accepted (fraction)")
    right.set_yticklabels([])
    fig.suptitle("Speculative decoding: speed and acceptance")
    return fig


def throughput_panels(table: pd.DataFrame, x: str | None = None, knee: float | None = None,
                      title: str = "Throughput as load grows") -> Figure:
    """Output tokens/s (left panel) and requests/s (right panel) per run of a sweep, each on its own axis so
    the two lines cannot lie on top of each other; the knee marked in both when given."""
    x = _sweep_x(table, x)
    data = table.sort_values(x)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    for ax, column, label, color in ((axes[0], "output_throughput", "output tokens/s", "tab:blue"),
                                     (axes[1], "request_throughput", "requests/s", "tab:orange")):
        ax.plot(data[x], data[column], marker="o", color=color)
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        _log2_x_if_wide(ax, data[x])
        if knee is not None:
            ax.axvline(knee, color="tab:red", linestyle=":", label=f"knee at {knee:g}")
            ax.legend(loc="lower right")
    fig.suptitle(title)
    return fig


def server_gauges(gauges: pd.DataFrame, title: str = "Server state during the run") -> Figure:
    """KV-cache usage (fraction, top) and running / waiting requests (bottom) against time in s, in two
    panels with their legends outside the data."""
    t = gauges["t_s"] if "t_s" in gauges else gauges["t"] - gauges["t"].iloc[0]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.5), sharex=True, constrained_layout=True)
    top.plot(t, gauges["kv_cache_usage"], color="tab:purple", label="KV cache used")
    top.set_ylim(0, 1.05)
    top.set_ylabel("KV used (0..1)")
    bottom.step(t, gauges["num_requests_running"], where="post", color="tab:green", label="running")
    bottom.step(t, gauges["num_requests_waiting"], where="post", color="tab:red", label="waiting")
    bottom.set_ylim(bottom=0)
    bottom.set_ylabel("requests")
    bottom.set_xlabel("time since the run started (s)")
    for ax in (top, bottom):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    top.set_title(title)
    return fig


def expected_length(table: pd.DataFrame) -> Figure:
    """Tokens per verification step against the first guess's acceptance a: the formula (1 - a^(k+1)) / (1 - a)
    as one curve per k, and each measured configuration as a point at its own a (``expected_length_table`` rows)."""
    from helpers.planning.acceptance import expected_accepted_length

    fig, ax = plt.subplots(figsize=(8.5, 4.2), constrained_layout=True)
    a = [i / 100 for i in range(100)]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, k in enumerate(sorted(set(table.k))):
        color = colors[i % len(colors)]
        ax.plot(a, [expected_accepted_length(x, int(k)) for x in a], color=color, label=f"formula, k={k}")
        points = table[table.k == k]
        ax.scatter(points.a_first_guess, points.measured_length, color=color, edgecolor="black", zorder=3,
                   label=f"measured, k={k}")
        for _, r in points.iterrows():
            ax.annotate(str(r.config), (r.a_first_guess, r.measured_length), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=1)
    ax.set_xlabel("a: share of first guesses accepted (fraction)")
    ax.set_ylabel("tokens per verification step")
    ax.set_title("Expected accepted length: formula against measurement")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig
