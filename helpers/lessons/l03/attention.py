"""Self-attention by hand on a real model's weights: one layer's T x T score matrix, and what the KV cache saves.

``attention_by_hand`` takes the hidden states entering one layer of the shipped tiny model (a Qwen3),
applies that layer's own norm, query/key projections, q/k norms and rotary positions, and computes
softmax(q k^T / sqrt(head_dim)) with the causal mask: row i holds how much token i attends to tokens
0..i, and everything above the diagonal is masked out. ``model_attention`` asks transformers' eager
attention for the same matrix, so the hand computation can be checked against the model.

Counting scores (one query-key dot product each, per head and layer): a step over a context of N tokens
that recomputes everything fills the whole lower triangle, N(N+1)/2 scores; with the keys kept (the KV
cache) only the newest token's row is new, N scores. Summed over a generation, the first grows with the
cube of the length, the second with its square. ``time_score_work`` times exactly that work on one head.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion


@dataclass(frozen=True)
class ScoreMatrix:
    """One head's attention weights (T x T, rows sum to 1) and the tokens they belong to."""

    weights: "object"  # numpy array, T x T
    tokens: list[str]
    layer: int
    head: int

    @property
    def masked_weight(self) -> float:
        """Sum of the weights above the diagonal (a future token): 0 under the causal mask."""
        import numpy as np

        return float(np.triu(self.weights, k=1).sum())

    @property
    def max_row_sum_error(self) -> float:
        """Largest |row sum - 1|: each row is a softmax, so 0 up to rounding."""
        import numpy as np

        return float(np.abs(self.weights.sum(axis=1) - 1).max())


def _check_layer_head(model, layer: int, head: int) -> None:
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    if not 0 <= layer < layers:
        raise ValueError(f"layer {layer} does not exist: the model has layers 0..{layers - 1}")
    if not 0 <= head < heads:
        raise ValueError(f"head {head} does not exist: the model has heads 0..{heads - 1}")


def attention_by_hand(model, tokenizer, prompt_ids: list[int], layer: int = 0, head: int = 0) -> ScoreMatrix:
    """softmax(q k^T / sqrt(d)) with the causal mask, for ``head`` of ``layer``, from the layer's own weights
    (a Qwen3-style layer: input norm, q/k projections, per-head q/k norms, rotary positions)."""
    import torch
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    _check_layer_head(model, layer, head)
    if len(prompt_ids) < 2:
        raise ValueError("give at least two prompt tokens: one token has nothing earlier to attend to")
    ids = torch.tensor([prompt_ids])
    block = model.model.layers[layer]
    attn = block.self_attn
    hd, n = attn.head_dim, len(prompt_ids)
    with torch.inference_mode():
        hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[layer]
        x = block.input_layernorm(hidden)
        q = attn.q_norm(attn.q_proj(x).view(1, n, -1, hd)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(1, n, -1, hd)).transpose(1, 2)
        cos, sin = model.model.rotary_emb(x, torch.arange(n).unsqueeze(0))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        kv_head = head // attn.num_key_value_groups  # grouped-query attention: heads share a key head
        scores = (q[0, head] @ k[0, kv_head].T) * attn.scaling
        scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1), float("-inf"))
        weights = torch.softmax(scores, dim=-1)
    return ScoreMatrix(weights.numpy(), tokenizer.convert_ids_to_tokens(prompt_ids), layer, head)


def model_attention(model, prompt_ids: list[int], layer: int = 0, head: int = 0):
    """The same head's attention weights as transformers' eager attention computes them (T x T numpy)."""
    import torch

    _check_layer_head(model, layer, head)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([prompt_ids]), output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation(previous)
    return out.attentions[layer][0, head].numpy()


def scores_per_step(context_tokens: int, cached: bool) -> int:
    """Query-key scores one step computes over a context of N tokens (one head, one layer): N(N+1)/2
    without a cache (the whole causal triangle again), N with one (the newest token's row)."""
    if context_tokens < 0:
        raise ValueError("context_tokens must be >= 0")
    n = context_tokens
    return n if cached else n * (n + 1) // 2


def scores_for_generation(prompt_tokens: int, new_tokens: int, cached: bool) -> int:
    """Scores over a whole generation: a prefill of the prompt (the triangle once) then one step per new token,
    each step recomputing everything (``cached`` False) or adding one row (``cached`` True)."""
    total = scores_per_step(prompt_tokens, cached=False)  # the prefill itself fills the triangle once
    for context in range(prompt_tokens + 1, prompt_tokens + new_tokens):
        total += scores_per_step(context, cached)
    return total


def score_counts(context_lengths: list[int]) -> pd.DataFrame:
    """Per context length N: scores one step computes without and with a KV cache, and their ratio ((N+1)/2)."""
    rows = [{"context_tokens": n, "scores_without_cache": scores_per_step(n, False),
             "scores_with_cache": scores_per_step(n, True)} for n in context_lengths]
    table = pd.DataFrame(rows)
    table["ratio"] = table["scores_without_cache"] / table["scores_with_cache"]
    return table


def time_score_work(head_dim: int, prompt_tokens: int, new_tokens: int, repeats: int = 5, seed: int = 0) -> pd.DataFrame:
    """Seconds to compute a generation's scores on one head (random q/k of ``head_dim``), without a cache (each
    step the full causal q k^T) and with one (each step one row against the stored keys); best of ``repeats``,
    the two interleaved. One row per way, with the scores counted."""
    import torch

    total = prompt_tokens + new_tokens
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(total, head_dim, generator=gen), torch.randn(total, head_dim, generator=gen)
    mask = torch.triu(torch.ones(total, total, dtype=torch.bool), diagonal=1)

    def without() -> None:
        for n in range(prompt_tokens, total):
            (q[:n] @ k[:n].T).masked_fill_(mask[:n, :n], float("-inf"))

    def with_cache() -> None:
        q[:prompt_tokens] @ k[:prompt_tokens].T  # the prefill fills the triangle once
        for n in range(prompt_tokens + 1, total):
            q[n - 1:n] @ k[:n].T

    best = {"without": float("inf"), "with KV cache": float("inf")}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # products this small gain nothing from threads, and threads waiting on a busy core add noise
    try:
        for _ in range(max(1, repeats)):
            for name, work in (("without", without), ("with KV cache", with_cache)):
                start = time.perf_counter()
                work()
                best[name] = min(best[name], time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return pd.DataFrame([{"cache": name, "scores": scores_for_generation(prompt_tokens, new_tokens, name != "without"),
                          "seconds": seconds} for name, seconds in best.items()])


def conclude_score_matrix(by_hand: ScoreMatrix, model_weights, tolerance: float = 1e-4) -> Conclusion:
    """The hand-computed matrix against the model's own: causal (nothing above the diagonal), rows of 1, equal."""
    import numpy as np

    diff = float(np.abs(by_hand.weights - model_weights).max())
    n = len(by_hand.tokens)
    text = (f"layer {by_hand.layer}, head {by_hand.head}: a {n} x {n} matrix, {by_hand.masked_weight:.1e} weight above "
            f"the diagonal, rows summing to 1 within {by_hand.max_row_sum_error:.1e}, and at most {diff:.1e} away from "
            "the model's own attention")
    expectation = "attention by hand equals the model's, and no token looks ahead"
    ok = diff <= tolerance and by_hand.masked_weight == 0 and by_hand.max_row_sum_error <= tolerance
    return Conclusion(text + ("." if ok else ": a difference beyond rounding, so the hand computation missed a step "
                                             "of this layer (a norm, the rotary positions, the head grouping)."),
                      SHOWN if ok else NOT_SHOWN, expectation)


def conclude_score_work(timed: pd.DataFrame) -> Conclusion:
    """The timed score work: recomputing the triangle every step against one row per step."""
    by = timed.set_index("cache")
    count_ratio = by.loc["without", "scores"] / by.loc["with KV cache", "scores"]
    time_ratio = by.loc["without", "seconds"] / max(by.loc["with KV cache", "seconds"], 1e-12)
    text = (f"without a cache the generation computed {by.loc['without', 'scores']:,} scores in "
            f"{by.loc['without', 'seconds'] * 1000:,.1f} ms, with it {by.loc['with KV cache', 'scores']:,} in "
            f"{by.loc['with KV cache', 'seconds'] * 1000:,.1f} ms: {count_ratio:.0f}x the work took {time_ratio:.1f}x "
            "the time")
    expectation = "recomputing every step's scores costs more time than keeping the keys"
    if time_ratio > 1:
        return Conclusion(text + (" (each small product also pays a fixed overhead, so time grows less than the count)."
                                  if time_ratio < count_ratio / 2 else "."), SHOWN, expectation)
    return Conclusion(text + ": no saving here, so fixed per-call overheads dominate work this small (raise "
                      "NAIVE_NEW_TOKENS), or the machine was busy.", NOT_SHOWN, expectation)


def plot_score_matrix(matrix: ScoreMatrix, title: str | None = None) -> "object":
    """The T x T attention weights as a heat map, tokens on both axes; the masked (future) cells blank."""
    import matplotlib.pyplot as plt
    import numpy as np

    n = len(matrix.tokens)
    shown = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), np.nan, matrix.weights)
    fig, ax = plt.subplots(figsize=(6.5, 5.5), constrained_layout=True)
    image = ax.imshow(shown, cmap="viridis", vmin=0, vmax=1)
    labels = [t.replace("Ġ", "·") for t in matrix.tokens]
    ax.set_xticks(range(n), labels, rotation=90, fontsize="small")
    ax.set_yticks(range(n), labels, fontsize="small")
    ax.set_xlabel("key: the earlier token looked at")
    ax.set_ylabel("query: the token being computed")
    ax.set_title(title or f"Attention weights, layer {matrix.layer}, head {matrix.head} (blank: masked, the future)")
    fig.colorbar(image, ax=ax, label="softmax weight (each row sums to 1)")
    return fig


GROWTH_CHOICES = ("about 2x", "about 4x", "about 8x")


def growth_outcome(before: pd.DataFrame, after: pd.DataFrame) -> tuple[str, str]:
    """Exercise: how much longer the uncached score work took (``time_score_work`` before and after a change),
    as one of ``GROWTH_CHOICES``, and the sentence with the time and the count ratios."""
    b, a = before.set_index("cache").loc["without"], after.set_index("cache").loc["without"]
    growth, counted = a["seconds"] / b["seconds"], a["scores"] / b["scores"]
    outcome = GROWTH_CHOICES[0] if growth < 3 else GROWTH_CHOICES[1] if growth < 6 else GROWTH_CHOICES[2]
    detail = f"the time grew {growth:.1f}x for {counted:.1f}x the scores (each step's triangle grows with N²)"
    if not counted / 2 <= growth <= counted * 2:
        detail += ("; the time moved far from the count, so fixed overheads or a busy machine weighed on one of the "
                   "two timings: run the cell again")
    return outcome, detail + "."
