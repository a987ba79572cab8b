"""The KV cache on the live engine: one request's blocks, and prefix caching (cold against warm); then the
verdicts on reusing a cached prefix from a tier of the memory hierarchy (``helpers.planning.kv_reuse`` computes
the tables and measures this machine's reads).

``measure_prefix_cache`` runs rounds of two requests on a prefix new to the run: the first is cold
(its prefix is computed), the second warm (its prefix's blocks are found in the cache), so cold and
warm alternate A B A B and a busy spell hits both. The conclusions judge each effect from the numbers.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

import pandas as pd

from helpers.core.comparison import BETTER, SAME, compare_samples
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion


def measure_prefix_cache(settings: Any, prefix_tokens: int, rounds: int, unique_tokens: int = 64,
                         output_tokens: int = 8) -> pd.DataFrame:
    """``rounds`` x (cold, warm) requests sharing a ``prefix_tokens``-token prefix new to each round;
    one row per request with its round, ``cache`` ("cold" / "warm"), prompt tokens and TTFT (ms)."""
    from helpers.measure.bench_results import requests_frame
    from helpers.measure.loadgen import run_load
    from helpers.measure.workloads import Load, Workload
    from helpers.core.progress import steps

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


# ---------------------------------------------------------------------------------------------
# Break the cache: one changed token early in a shared prefix


def _served_prompt(metrics_url: str, before: Any, prompt_tokens: int | None, wait_s: float = 3.0) -> dict[str, Any]:
    """The server's counters since ``before``, once they count the request's prompt (polled up to ``wait_s``)."""
    from helpers.measure.server_metrics import scrape, window

    deadline = time.monotonic() + wait_s
    while True:
        served = window(before, scrape(metrics_url))
        if (served["prefix_cache_queries"] or 0) >= (prompt_tokens or 1) or time.monotonic() > deadline:
            return served
        time.sleep(0.1)


def measure_break_cache(lab: Any, prefix_tokens: int, change_at: int, output_tokens: int = 4,
                        hasher: Any = None) -> pd.DataFrame:
    """Three requests on one new ``prefix_tokens``-token prefix: cold, warm (the same prefix), then the prefix with
    ONE word changed at content position ``change_at``. One row each: prompt tokens, prompt tokens the server's
    prefix cache served (``vllm:prefix_cache_hits``), the prompt tokens the block-hash chain predicts it served
    (``hasher``, default ``prefix_hash.block_hashes``, over the token ids the server returned; NaN when it returned
    none), TTFT (ms). ``attrs["token_ids"]``: each request's (prompt ids, generated ids)."""
    from helpers.core.progress import steps
    from helpers.lessons.l03.prefix_hash import TokenIds, block_hashes, predicted_hits
    from helpers.measure.loadgen import prompt_factory
    from helpers.measure.server_metrics import scrape
    from helpers.measure.stream_timing import stream_chat
    from helpers.measure.workloads import MARKER

    if not 0 <= change_at < prefix_tokens:
        raise ValueError(f"change_at must be a position inside the prefix: 0..{prefix_tokens - 1}, got {change_at}")
    factory = prompt_factory(lab.settings, lab.model, seed=secrets.randbits(30))  # a prefix new to this run
    words = [factory.words[secrets.randbelow(len(factory.words))] for _ in range(prefix_tokens)]
    changed = list(words)
    changed[change_at] = next(w for w in factory.words if w != words[change_at])
    prompts = {"cold": words, "warm (same prefix)": words, f"one token changed at {change_at}": changed}
    block_size = int((scrape(lab.settings.metrics_url).cache_config() or {}).get("block_size") or 0)
    rows, ids = [], []
    client = TokenIds(lab.client)
    for name in steps(prompts, "break the cache: requests", "request"):
        tail = factory.uid_words(secrets.randbits(30))  # each request ends differently, as real ones do
        before = scrape(lab.settings.metrics_url)
        timing = stream_chat(client, lab.model, [{"role": "user", "content": MARKER + "".join(prompts[name] + tail)}],
                             max_tokens=output_tokens)
        served = _served_prompt(lab.settings.metrics_url, before, timing.prompt_tokens)
        ids.append((client.prompt_ids, client.output_ids))
        rows.append({"request": name, "prompt_tokens": timing.prompt_tokens, "cached_tokens": served["prefix_cache_hits"],
                     "ttft_ms": timing.ttft_s * 1000 if timing.ttft_s is not None else float("nan"),
                     "error": timing.error or ""})
    frame = pd.DataFrame(rows)
    if block_size and all(prompt for prompt, _ in ids):
        frame.insert(3, "predicted_cached_tokens", predicted_hits(ids, block_size, hasher or block_hashes))
    else:
        frame.insert(3, "predicted_cached_tokens", float("nan"))
    frame.attrs["token_ids"], frame.attrs["block_size"] = ids, block_size
    return frame


def conclude_break_cache(requests: pd.DataFrame, block_size: int) -> Conclusion:
    """The warm request served from the cache, the one with a changed token not (or only its blocks before the
    change); TTFT named alongside (one request each: a hint, not a measurement against noise)."""
    cold, warm, broken = (requests.iloc[i] for i in range(3))
    text = (f"cached prompt tokens: cold {cold.cached_tokens:,.0f}, warm {warm.cached_tokens:,.0f}, with one token "
            f"changed {broken.cached_tokens:,.0f} (of {broken.prompt_tokens:,}); TTFT {cold.ttft_ms:,.0f} / "
            f"{warm.ttft_ms:,.0f} / {broken.ttft_ms:,.0f} ms")
    expectation = "one changed early token turns the prefix's cache hits into misses"
    if warm.cached_tokens <= 0:
        return Conclusion(text + ": even the warm request found nothing cached, so prefix caching is off "
                          "(--enable-prefix-caching) or the prefix is shorter than one block "
                          f"({block_size} tokens).", NOT_SHOWN, expectation)
    if broken.cached_tokens < warm.cached_tokens:
        kept = ("none of it" if broken.cached_tokens == 0 else
                f"only the {broken.cached_tokens // block_size:.0f} block(s) of {block_size} before the change")
        return Conclusion(text + f": the changed request reused {kept}. vLLM hashes each block together with all "
                          "blocks before it, so every block from the changed one on is new.", SHOWN, expectation)
    return Conclusion(text + ": the changed request was served from the cache as much as the warm one, so the change "
                      "fell after the last full block the two share.", NOT_SHOWN, expectation)


MIDDLE_CHOICES = ("none", "part of it", "all of it")


def middle_change_outcome(requests: pd.DataFrame, block_size: int) -> tuple[str, str]:
    """Exercise: how much of the prefix a request with ONE token changed in its middle still found cached
    (``measure_break_cache`` rows: cold, warm, changed), as one of ``MIDDLE_CHOICES``, with the numbers and why."""
    warm, late = requests["cached_tokens"].iloc[1], requests["cached_tokens"].iloc[2]
    outcome = MIDDLE_CHOICES[0] if late == 0 else MIDDLE_CHOICES[1] if late < warm else MIDDLE_CHOICES[2]
    return outcome, (f"{late:,.0f} cached prompt tokens against {warm:,.0f} for the unchanged prefix: every full "
                     f"block of {block_size} before the changed token is reused.")


def sample_long_request(lab: Any, prompt_tokens: int, output_tokens: int, interval_s: float = 0.1,
                        after_s: float = 1.0) -> tuple[pd.DataFrame, int]:
    """Run one request while sampling the server's gauges (and ``after_s`` seconds after it ended): the samples
    (with ``t_s`` from the first) and the request's tokens (prompt + completion)."""
    from helpers.measure.loadgen import run_load
    from helpers.measure.workloads import Load, Workload
    from helpers.measure.server_metrics import GaugeSampler

    with GaugeSampler(lab.settings.metrics_url, interval_s=interval_s, model=lab.model) as sampler:
        long = run_load(lab.settings, Workload(input_len=prompt_tokens, output_len=output_tokens),
                        Load(concurrency=1, num_requests=1))
        time.sleep(after_s)  # keep sampling after the request ended
    gauges = sampler.frame()
    gauges["t_s"] = gauges["t"] - gauges["t"].iloc[0]
    timing = long.requests[0].timing
    return gauges, (timing.prompt_tokens or 0) + (timing.completion_tokens or 0)


# ---------------------------------------------------------------------------------------------
# Hierarchical reuse: loading a prefix's KV against recomputing it


def conclude_machine_reuse(table: pd.DataFrame) -> Conclusion:
    """This machine: does reading a prefix's KV (from the file, the slower of the two reads) beat the engine's
    prefill at every prompt length measured?"""
    if table.empty:
        return Conclusion("no prompt length was measured: nothing to compare.", NOT_SHOWN, "loading KV beats recomputing it")
    slowest = table["read_from_file_ms"].combine(table["read_from_RAM_ms"], max)
    ratio = table["recompute_ttft_ms"] / slowest
    longest = table.iloc[-1]
    text = (f"at {int(longest.prompt_tokens):,} prompt tokens ({longest.kv_MB:.2f} MB of KV) the engine's prefill took "
            f"{longest.recompute_ttft_ms:,.1f} ms, reading the bytes {longest.read_from_RAM_ms:.3f} ms from RAM and "
            f"{longest.read_from_file_ms:.3f} ms from a file in the page cache; over all lengths reading was "
            f"{ratio.min():,.0f}x to {ratio.max():,.0f}x faster")
    expectation = "on this machine reading a prefix's KV beats recomputing it"
    if (ratio > 1).all():
        return Conclusion(text + ". A prefix cache that spills to host memory or a local disk pays off here too.",
                          SHOWN, expectation)
    losing = table.loc[ratio <= 1, "prompt_tokens"].tolist()
    return Conclusion(f"{text}: at {losing} tokens reading was not faster (a tiny model prefills very fast, or the "
                      "machine was busy during the reads).", NOT_SHOWN, expectation)


def conclude_tiers(system: str, verdicts: pd.DataFrame, tokens: int, mfu: float) -> Conclusion:
    """The talk's question for one system: which tiers beat recomputing a ``tokens``-token prefix, and from
    which length on (``tier_verdicts`` output)."""
    wins = verdicts[verdicts["recompute_over_load"] > 1]
    parts = [f"{r.tier} {r.load_ms:,.1f} ms" for r in verdicts.itertuples()]
    recompute_ms = verdicts["recompute_ms"].iloc[0]
    text = (f"{system}, a {tokens:,}-token prefix, prefill at {mfu:.0%} of the peak: recompute {recompute_ms:,.1f} ms; "
            f"load: {'; '.join(parts)}")
    expectation = "loading a cached prefix beats recomputing it from every tier"
    if len(wins) == len(verdicts):
        return Conclusion(text + f". Every tier wins, even the slowest by {verdicts['recompute_over_load'].min():.1f}x: "
                          "keeping KV, anywhere in the hierarchy, is cheaper than prefilling it again.", SHOWN, expectation)
    slow = verdicts[verdicts["recompute_over_load"] <= 1]
    names = ", ".join(f"{r.tier} (wins only from {r.loading_wins_from_tokens:,} tokens)" for r in slow.itertuples())
    return Conclusion(text + f". Recomputing is faster than loading from {names}.", NOT_SHOWN, expectation)
