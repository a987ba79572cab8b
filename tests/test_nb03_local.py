"""Notebook 03 on the local path: run top to bottom against the shared real engine (tests/notebook_local.py)."""

from __future__ import annotations

import re

import pytest

from helpers.core.vllm_args import flag_value
from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine


def test_notebook_03_measures_prefill_decode_and_the_kv_cache(lab, tmp_path):
    run = run_local("03_prefill_decode_kv_cache.ipynb", tmp_path,
                    parameters={"PROMPT_LENGTHS": [64, 1024], "REPEATS": 2, "NAIVE_NEW_TOKENS": 32,
                                   "LONG_OUTPUT_TOKENS": 300, "AGENT_TURNS": 3, "STALL_STREAMS": 2,
                                   "SHARED_PREFIX_TOKENS": 512})
    text = printed(run)
    assert "same 32 tokens from both loops: True" in text
    assert re.search(r"What you should see: attention by hand equals the model's, and no token looks ahead\n  ✔", text)
    # break the cache: the warm request hits, the one with an early token changed hits less (the server's counter)
    cold, warm, changed = (int(n.replace(",", "")) for n in re.search(
        r"cached prompt tokens: cold ([\d,]+), warm ([\d,]+), with one token changed ([\d,]+)", text).groups())
    assert cold == 0 and warm > 0 and changed < warm
    assert re.search(r"\[shown\] loading a cached prefix beats recomputing it from every tier: DGX A100", text)
    assert re.search(r"\[(shown|not shown)\] on this machine reading a prefix's KV beats recomputing it: at [\d,]+ "
                     r"prompt tokens", text)
    assert text.count("(made by the test run)") == 3  # every exercise ran and checked its outcome
    assert re.search(r"This run: (none|part of it|all of it)\. [\d,]+ cached prompt tokens", text)
    blocks, measured = map(int, re.search(r"-> (\d+) blocks of .* = (\d+) blocks;", text, re.S).groups())
    # The gauge is sampled (every 0.1 s, by a client that shares a core with the server): it may miss the
    # last blocks' few steps, but it can never exceed what the request holds.
    assert blocks // 2 < measured <= blocks
    assert "after the request ended 0.0000%" in text
    hits, queries = map(float, re.search(r"server: (\d+) of (\d+) prompt tokens served from the prefix cache",
                                         text).groups())
    assert 0 < hits < queries  # three warm requests hit, the cold one did not
    assert re.search(r"the server took [1-9][\d.]*% of [\d,]+ prompt tokens from the prefix cache", text)
    assert re.search(r"\[(shown|not shown|within noise)\] TTFT grows with the prompt: TTFT went from", text)
    assert re.search(r"\[(shown|not shown)\] TPOT hardly moves with the prompt: TPOT went from", text)
    assert re.search(r"\[(shown|within noise|not shown)\] a warm prefix cuts TTFT: TTFT [\d,]+ ms cold", text)
    for config in ("max-num-batched-tokens 2048 (default)", "max-num-batched-tokens 256"):  # both measured
        assert f"{config}: the long prefill stalls the running streams" in text
    assert re.search(r"\[(shown|not shown|within noise)\] a smaller prefill chunk makes the long request's own TTFT "
                     r"longer: the long prompt's prefill took [\d,]+ ms", text)
    assert " nan ms" not in text and "steady gap of nan" not in text
    # section 10: continuous batching, PagedAttention's blocks and preemption, each checked against this run
    assert re.search(r"section 9 preempted 0 request", text)  # the small pool held the stall runs
    assert re.search(r"\[(shown|not shown)\] a request arriving mid-decode joins the running batch at the next engine "
                     r"step: the late request arrived while the early one decoded: it waited [\d.,]+ ms in the "
                     r"server's queue = [\d.]+ engine steps", text)
    assert re.search(r"\[(shown|not shown)\] the running request barely pauses while the new one joins", text)
    matched, samples = map(int, re.search(r"\] KV blocks are allocated as a sequence grows, one block per block_size "
                                          r"tokens: (\d+) of (\d+) samples", text).groups())
    assert samples > 0 and matched <= samples
    preemptions = int(re.search(r"\[shown\] when the KV blocks run out, the scheduler preempts a request and "
                                r"recomputes it later: 4 requests needing \d+ blocks .* preempted (\d+) time", text).group(1))
    assert preemptions > 0
    assert "engine back on the flags it had before section 9: True" in text
    assert lab.engine.is_ready() and flag_value(lab.engine.args(), "--max-num-batched-tokens") is None
