"""A picture of the paged KV cache, drawn from a run (issue 27, part 4): each request's logical blocks, filling.

vLLM reports the KV cache as counts and durations (the usage gauge, the block size, the pool's blocks; per request its
queue, prefill and decode times), never which physical block holds which tokens. So the picture shows what a run does
give: for each request, its logical blocks in order (block b holds its tokens b x block_size ... (b + 1) x block_size
- 1), how full each is at a few moments (from the prompt's length and the arrival time of every generated token), and
the prefix cache's hash of each full block (``prefix_hash.block_hashes`` over the token ids the server returned:
prompt, then generated). Beside each moment: the pool's used blocks as the gauge's nearest sample read them, with how
far that sample is from the moment (it can lag a block's allocation or release by a step or a sample). Where the blocks sit in
the pool is not drawn: no metric says.

``paged_view`` turns the streams into rows (pure); ``plot_paged_kv`` takes those rows and returns a Figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from helpers.lessons.l03.prefix_hash import block_hashes, short

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HELD, PREFILL, FREED, NOT_YET = "held", "prefilling", "freed", "not sent yet"
VIEW_COLUMNS = ["moment", "t_s", "request", "state", "block", "tokens", "full", "hash"]


@dataclass(frozen=True)
class BlockStream:
    """One request as the picture needs it (perf_counter seconds): when it was sent, its first token came and it
    ended, its prompt's length, each generated token's arrival, and its token ids (prompt then generated; None when
    the server returned none)."""

    name: str
    t_sent: float
    t_first_token: float | None
    t_done: float | None
    prompt_tokens: int
    token_times: Sequence[float]
    token_ids: Sequence[int] | None = None

    def tokens_at(self, t: float) -> tuple[str, int]:
        """The request's state at ``t`` and the tokens its KV blocks hold then: the prompt's once it is scheduled
        (its blocks are allocated for the prefill), plus each generated token that had arrived."""
        if t < self.t_sent:
            return NOT_YET, 0
        if self.t_done is not None and t >= self.t_done:
            return FREED, 0
        if self.t_first_token is None or t < self.t_first_token:
            return PREFILL, self.prompt_tokens
        return HELD, self.prompt_tokens + sum(1 for s in self.token_times if s <= t)


def paged_view(streams: Sequence[BlockStream], block_size: int, moments: Mapping[str, float]) -> pd.DataFrame:
    """One row per (moment, request, logical block): the tokens the block holds, whether it is full, and its prefix
    hash (6 hex digits; "" for a block not yet full or without token ids). A request with no block at a moment (not
    sent, or ended: its blocks freed) gets one row with block -1. ``moments``: name -> perf_counter time."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    hashes = {s.name: block_hashes(list(s.token_ids), block_size) if s.token_ids else [] for s in streams}
    t0 = min((s.t_sent for s in streams), default=0.0)
    rows = []
    for moment, t in moments.items():
        for s in streams:
            state, tokens = s.tokens_at(t)
            if tokens == 0:
                rows.append({"moment": moment, "t_s": t - t0, "request": s.name, "state": state, "block": -1,
                             "tokens": 0, "full": False, "hash": ""})
                continue
            for b in range(math.ceil(tokens / block_size)):
                held = min(block_size, tokens - b * block_size)
                chain = hashes[s.name]
                label = short(chain[b]) if held == block_size and b < len(chain) else ""
                rows.append({"moment": moment, "t_s": t - t0, "request": s.name, "state": state, "block": b,
                             "tokens": held, "full": held == block_size, "hash": label})
    return pd.DataFrame(rows, columns=VIEW_COLUMNS)


def pool_used(gauges: pd.DataFrame, moments: Mapping[str, float],
              num_blocks: int) -> dict[str, tuple[int, float] | None]:
    """The pool's used blocks at each moment, from the gauge sample nearest to it (KV usage x (blocks - 1): one block
    is vLLM's null block), with that sample's time from the moment (s; the server reports its last recorded step, so
    a sample can lag a block's allocation or release); None where no sample was taken."""
    out: dict[str, tuple[int, float] | None] = {}
    usable = gauges.dropna(subset=["kv_cache_usage"]) if len(gauges) else gauges
    for moment, t in moments.items():
        if not len(usable):
            out[moment] = None
            continue
        nearest = usable.iloc[(usable["t"] - t).abs().argmin()]
        out[moment] = (round(float(nearest["kv_cache_usage"]) * (num_blocks - 1)), float(nearest["t"]) - t)
    return out


def plot_paged_kv(view: pd.DataFrame, block_size: int, used: Mapping[str, tuple[int, float] | None] | None = None,
                  title: str = "PagedAttention: each request's KV blocks, as this run filled them") -> Figure:
    """``paged_view`` rows as one panel per moment: per request a row of its logical blocks, each shaded as full as
    it is and labelled with its prefix hash (full) or its tokens (filling); a freed request drawn as such. ``used``:
    the pool's used blocks per moment and the gauge sample's offset from it (``pool_used``), in each panel's title."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    moments = list(dict.fromkeys(view["moment"]))
    requests = list(dict.fromkeys(view["request"]))
    widest = max(int(view["block"].max()) + 1 if len(view) else 1, 1)
    vertical = widest > 10
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(len(moments), 1, squeeze=False,
                             figsize=(max(8.0, 0.75 * widest + 2.5), 1.0 + 0.8 * len(requests) * len(moments)))
    for ax, moment in zip(axes[:, 0], moments):
        rows = view[view["moment"] == moment]
        for y, name in enumerate(requests):
            mine = rows[rows["request"] == name]
            colour = colours[y % len(colours)]
            for r in mine.itertuples():
                if r.block < 0:
                    ax.text(0, y, f"{r.state}" + (" (its blocks back in the pool)" if r.state == FREED else ""),
                            va="center", ha="left", fontsize=8, color="grey", style="italic")
                    continue
                ax.add_patch(Rectangle((r.block, y - 0.4), 0.92, 0.8, fill=False, edgecolor=colour, linewidth=1.2))
                ax.add_patch(Rectangle((r.block, y - 0.4), 0.92 * r.tokens / block_size, 0.8, color=colour,
                                       alpha=0.35 if r.state == HELD else 0.15, linewidth=0))
                label = r.hash if r.full and r.hash else ("full" if r.full else f"{r.tokens}/{block_size}")
                ax.text(r.block + 0.46, y, label, ha="center", va="center", fontsize=7 if vertical else 8,
                        rotation=90 if vertical else 0, family="monospace")
        ax.set_xlim(-0.1, widest + 0.1)
        ax.set_ylim(len(requests) - 0.4, -0.6)
        ax.set_yticks(range(len(requests)), requests)
        ax.set_xticks([b + 0.46 for b in range(widest)], [str(b) for b in range(widest)], fontsize=7)
        t_s = float(rows["t_s"].iloc[0]) if len(rows) else 0.0
        held = int((rows["block"] >= 0).sum())
        gauge = (used or {}).get(moment)
        ax.set_title(f"{moment}, t = {t_s:.1f} s: {held} blocks held"
                     + (f" (the pool's gauge {gauge[1]:+.2f} s from then: {gauge[0]} used)" if gauge is not None
                        else ""), fontsize=9, loc="left")
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1, 0].set_xlabel(f"the request's logical block ({block_size} tokens each): its prefix hash once full, "
                           "else the tokens it holds", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.text(0.01, 0.005, "vLLM reports block counts and durations, not which physical block holds what:\nthe blocks "
             "are drawn per request, in logical order, from this run's token ids and chunk times.", fontsize=7,
             color="grey")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig
