"""The KV cache on the live engine: one request's blocks, and prefix caching (cold against warm).

``measure_prefix_cache`` runs rounds of two requests on a prefix new to the run: the first is cold
(its prefix is computed), the second warm (its prefix's blocks are found in the cache), so cold and
warm alternate A B A B and a busy spell hits both. The conclusions judge each effect from the numbers.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import pandas as pd

from helpers.comparison import BETTER, SAME, compare_samples
from helpers.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion


def measure_prefix_cache(settings: Any, prefix_tokens: int, rounds: int, unique_tokens: int = 64,
                         output_tokens: int = 8) -> pd.DataFrame:
    """``rounds`` x (cold, warm) requests sharing a ``prefix_tokens``-token prefix new to each round;
    one row per request with its round, ``cache`` ("cold" / "warm"), prompt tokens and TTFT (ms)."""
    from helpers.bench_results import requests_frame
    from helpers.loadgen import Load, Workload, run_load
    from helpers.progress import steps

    frames = []
    for number in steps(range(max(1, rounds)), "prefix cache: cold/warm pairs", "pair"):
        workload = Workload(input_len=prefix_tokens + unique_tokens, output_len=output_tokens, prefix="shared",
                            shared_prefix_len=prefix_tokens, seed=secrets.randbits(30))
        frame = requests_frame(run_load(settings, workload, Load(concurrency=1, num_requests=2), progress=False))
        frames.append(frame.assign(round=number, cache=["cold", "warm"][: len(frame)]))
    return pd.concat(frames, ignore_index=True)[["round", "cache", "prompt_tokens", "ttft_ms", "ok"]]


def expected_blocks(tokens: int, block_size: int) -> int:
    """Blocks one request of ``tokens`` tokens holds at its peak: ceil(tokens / block_size)."""
    return math.ceil(tokens / block_size)


def conclude_kv_peak(tokens: int, block_size: int, num_blocks: int, peak_usage: float,
                     after_usage: float) -> list[Conclusion]:
    """The sampled KV gauge against the blocks one request must hold: at most that many, more than half
    (a sample can miss the last blocks' few steps), and zero once the request ended."""
    blocks = expected_blocks(tokens, block_size)
    measured = round(peak_usage * (num_blocks - 1))
    text = (f"one request of {tokens:,} tokens needs {blocks} blocks of {block_size} tokens; the gauge peaked at "
            f"{measured} blocks ({peak_usage:.4%} of {num_blocks - 1:,} usable blocks)")
    expectation = "the request holds ceil(tokens / block size) blocks"
    if blocks // 2 < measured <= blocks:
        peak = Conclusion(text + ("." if measured == blocks else
                                  f": the sampled gauge missed the last {blocks - measured} block(s)' few steps."),
                          SHOWN, expectation)
    else:
        peak = Conclusion(text + (": more than the request can hold, so another request shared the cache."
                                  if measured > blocks else ": far fewer, so the sampling missed most of the request."),
                          NOT_SHOWN, expectation)
    freed = Conclusion(f"after the request ended the gauge read {after_usage:.4%}.",
                       SHOWN if after_usage == 0 else NOT_SHOWN, "the blocks are freed when the request ends")
    return [peak, freed]


def conclude_prefix_cache(requests: pd.DataFrame, prefix_tokens: int, hit_rate: float) -> Conclusion:
    """Cold against warm TTFT (``measure_prefix_cache`` rows), judged against the rounds' spread."""
    ok = requests[requests["ok"]]
    verdict = compare_samples(ok.loc[ok.cache == "cold", "ttft_ms"].tolist(),
                              ok.loc[ok.cache == "warm", "ttft_ms"].tolist(), higher_is_better=False)
    text = (f"TTFT {verdict.mean_a:,.0f} ms cold vs {verdict.mean_b:,.0f} ms warm on a {prefix_tokens:,}-token shared "
            f"prefix ({verdict.describe()}); the server served {hit_rate:.1%} of the prompt tokens from the cache")
    expectation = "a warm prefix cuts TTFT"
    if verdict.label == BETTER:
        return Conclusion(text + ".", SHOWN, expectation)
    if verdict.label == SAME:
        why = (f"warm was faster on average, but the rounds differ by +/-{verdict.noise_rel:.0%} among themselves, so "
               "this run cannot tell (a noisy machine: raise PREFIX_ROUNDS or rerun when it is quiet)"
               if verdict.ratio < 1 - 0.1 else
               "no saving beyond the run-to-run spread (a prefix this short costs little to prefill here)")
        return Conclusion(f"{text}: {why}.", WITHIN_NOISE, expectation)
    reason = ("no prompt token came from the cache: is --enable-prefix-caching off?" if hit_rate == 0 else
              "the cache was hit, yet warm requests were slower: something else held them up (a busy machine)")
    return Conclusion(f"{text}: {reason}", NOT_SHOWN, expectation)


def conclude_agent_cache(hit_rate: float, prompt_tokens: float, turns: int) -> Conclusion:
    """An agent's re-sent conversation: the share of prompt tokens the prefix cache served."""
    text = (f"over {turns} turns the server took {hit_rate:.1%} of {prompt_tokens:,.0f} prompt tokens from the prefix "
            "cache: that much prefill work was not redone")
    return Conclusion(text + ".", SHOWN if hit_rate > 0 else NOT_SHOWN,
                      "a growing conversation is mostly served from the cache")
