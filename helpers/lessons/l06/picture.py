"""Draft-then-verify, drawn from a run: each verification step's guesses kept and rejected, read from one streamed
request's chunk sizes (``StreamTiming.chunk_tokens``, the server's own running token count).

At one request at a time vLLM sends each engine step's new tokens as one chunk: a chunk of n tokens is n - 1 kept
guesses and one token of the target's own (its correction after a rejected guess, or its bonus token when all k were
kept). The first chunk is the prefill's token. A chunk of more than k + 1 tokens held several steps (the client fell
behind) and is drawn as merged; the last chunk may be cut short by the output cap or the end of the answer.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

KEPT, REJECTED, UNCHECKED, TARGET = "#3a923a", "#d04a3a", "#dddddd", "#3a6fd0"


def verify_steps(chunk_tokens: Sequence[int], k: int) -> pd.DataFrame:
    """One row per chunk of a stream: its tokens, the guesses kept, whether a guess was rejected, the guesses never
    checked after the rejection (0 or more), and the kind ("prefill", "step", or "merged" for more than k + 1)."""
    if k < 1:
        raise ValueError("k (guesses per step) must be >= 1")
    rows = []
    for i, n in enumerate(int(n) for n in chunk_tokens):
        if n < 1:
            raise ValueError(f"chunk {i} carried {n} tokens: a chunk that reaches the plot carries at least one")
        if i == 0:
            rows.append({"step": i, "tokens": n, "kept": 0, "rejected": 0, "unchecked": 0, "kind": "prefill"})
        elif n > k + 1:
            rows.append({"step": i, "tokens": n, "kept": None, "rejected": None, "unchecked": None, "kind": "merged"})
        else:
            kept = n - 1
            rejected = int(kept < k)
            rows.append({"step": i, "tokens": n, "kept": kept, "rejected": rejected, "unchecked": k - kept - rejected,
                         "kind": "step"})
    return pd.DataFrame(rows, columns=["step", "tokens", "kept", "rejected", "unchecked", "kind"])


def draft_then_verify(steps: pd.DataFrame, k: int, max_steps: int = 12,
                      title: str = "Draft, then verify: what each step kept") -> Figure:
    """The first ``max_steps`` rows of ``verify_steps``: one row of k guess slots per step (kept green, the rejected
    one red, the ones after it grey) and the target's own token (blue) after them; the tokens per step on the right."""
    shown = steps.head(max_steps)
    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * (k + 2), 0.9 + 0.38 * max(1, len(shown))), constrained_layout=True)
    for row, r in enumerate(shown.itertuples()):
        y = len(shown) - 1 - row
        if r.kind == "merged":
            ax.add_patch(Rectangle((0, y + 0.1), k + 1, 0.8, facecolor="white", edgecolor="grey", hatch="//"))
            ax.text((k + 1) / 2, y + 0.5, f"{r.tokens} tokens: several steps in one chunk", ha="center", va="center",
                    fontsize=8)
        else:
            colours = [KEPT] * int(r.kept) + [REJECTED] * int(r.rejected) + [UNCHECKED] * int(r.unchecked)
            if r.kind == "prefill":
                colours = [UNCHECKED] * k
            for slot, colour in enumerate(colours):
                ax.add_patch(Rectangle((slot, y + 0.1), 0.9, 0.8, facecolor=colour, edgecolor="white"))
            ax.add_patch(Rectangle((k, y + 0.1), 0.9, 0.8, facecolor=TARGET, edgecolor="white"))
        ax.text(k + 1.1, y + 0.5, f"+{r.tokens}", va="center", fontsize=9)
    ax.set_xlim(0, k + 1.8)
    ax.set_ylim(0, max(1, len(shown)))
    ax.set_xticks([i + 0.45 for i in range(k + 1)], [f"guess {i + 1}" for i in range(k)] + ["target"])
    ax.set_yticks([len(shown) - 0.5 - i for i in range(len(shown))],
                  ["prefill" if r.kind == "prefill" else f"step {r.step}" for r in shown.itertuples()])
    ax.tick_params(length=0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.legend(handles=[Patch(color=KEPT, label="guess kept"), Patch(color=REJECTED, label="guess rejected"),
                       Patch(color=UNCHECKED, label="not checked (after a rejection)"),
                       Patch(color=TARGET, label="the target's own token")],
              loc="upper center", bbox_to_anchor=(0.5, -0.08 if len(shown) > 4 else -0.2), ncol=2, fontsize=8,
              frameon=False)
    ax.set_title(title, fontsize=10)
    return fig


def steps_summary(steps: pd.DataFrame, k: int) -> str:
    """One line: the verification steps read, the guesses kept of those proposed, and the tokens per step."""
    verified = steps[steps.kind == "step"]
    if not len(verified):
        return "no verification step in this stream (one chunk, or every chunk merged)"
    kept, proposed = int(verified.kept.sum()), k * len(verified)
    merged = int((steps.kind == "merged").sum())
    note = f"; {merged} chunk(s) held several steps and are left out" if merged else ""
    return (f"{len(verified)} verification steps: {kept} of {proposed} guesses kept ({kept / proposed:.0%}), "
            f"{verified.tokens.mean():.2f} tokens per step (k = {k}){note}")
