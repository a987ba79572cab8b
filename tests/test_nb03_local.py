"""Notebook 03 on the local path: run top to bottom against the shared real engine (tests/notebook_local.py), at the
smallest sizes that still run every should-see check on data (QUICK: each one's reason beside it)."""

from __future__ import annotations

import re

import nbformat
import pytest

from helpers.core.vllm_args import flag_value
from notebook_local import lab, no_silent_long_cells, printed, run_local  # noqa: F401 (fixtures)

pytestmark = pytest.mark.engine


# The quick parameters: the smallest that still decide every check (tests/should_see_checks.py) on this machine
QUICK = {"PROMPT_LENGTHS": [64, 1024],  # two lengths: TTFT's growth against the repeats' spread
         "REPEATS": 2,                  # a spread on each side
         "DECODE_TOKENS": 16,           # enough tokens for a TPOT
         "NAIVE_NEW_TOKENS": 16,        # the uncached loop still slower (its steps at ~200 tokens of context)
         "PREFIX_ROUNDS": 2,            # two cold and two warm: a spread on each side
         "SHARED_PREFIX_TOKENS": 512,   # four blocks of 128: the middle change (exercise 1) keeps two of them
         "JOIN_EARLY_TOKENS": 600,      # the early request still decodes when the late one is sent on a busy machine
         "LONG_OUTPUT_TOKENS": 150,     # one long request: 25 blocks, the peak still more than half of them
         "AGENT_TURNS": 2,              # the second turn finds the first in the cache
         "STALL_STREAMS": 2}            # running decodes for the long prefill to stall


def test_notebook_03_measures_prefill_decode_and_the_kv_cache(lab, tmp_path):
    run = run_local("03_prefill_decode_kv_cache.ipynb", tmp_path, parameters=QUICK)
    text = printed(run)
    assert "same 16 tokens from both loops: True" in text
    assert re.search(r"What you should see: attention by hand equals the model's, and no token looks ahead\n  ✔", text)
    # the mechanism cells' chain is the helper's, and it predicts the server's prefix-cache counter to the token
    assert re.search(r"What you should see: your block_hashes gives the chain vLLM computes\n  ✔", text)
    assert re.search(r"block 0: [0-9a-f]{8} vs [0-9a-f]{8}  changed", text)
    predicted, counted = re.search(r"your chain predicts the prompt tokens the server found cached\n  ✔ seen in this run: "
                                   r".* predicted ([\d,]+ / [\d,]+ / [\d,]+) cached prompt tokens .* counted "
                                   r"([\d,]+ / [\d,]+ / [\d,]+): equal", text).groups()
    assert predicted == counted and predicted.startswith("0 / ") and not predicted.endswith(" / 0 / 0")
    assert re.search(r"at this context the uncached step redoes mostly projections and MLP, not attention\n  ✔ seen in "
                     r"this run: at 208 tokens it redoes", text)
    assert "The worked solution (the KV blocks of a request): In this run the early request ended with" in text
    executed = nbformat.read(run.output, as_version=4)
    picture = next(c for c in executed.cells if "pictures.plot_paged_kv(" in c.source)
    assert any("image/png" in o.get("data", {}) for o in picture.outputs)  # the paged KV cache, drawn
    # break the cache: the warm request hits, the one with an early token changed hits less (the server's counter)
    cold, warm, changed = (int(n.replace(",", "")) for n in re.search(
        r"cached prompt tokens: cold ([\d,]+), warm ([\d,]+), with one token changed ([\d,]+)", text).groups())
    assert cold == 0 and warm > 0 and changed < warm
    assert re.search(r"loading a cached prefix beats recomputing it from every tier\n  ✔ seen in this run: DGX A100", text)
    assert re.search(r"on this machine reading a prefix's KV beats recomputing it\n  (✔|✘) [^:]*: at [\d,]+ prompt tokens",
                     text)
    assert text.count("(made by the test run)") == 3  # every exercise ran and checked its outcome (two in Go deeper)
    assert re.search(r"This run: (none|part of it|all of it)\. [\d,]+ cached prompt tokens", text)
    blocks, measured = map(int, re.search(r"-> (\d+) blocks of .* = (\d+) blocks;", text, re.S).groups())
    # The gauge is sampled (every 0.1 s, by a client that shares a core with the server): it may miss the
    # last blocks' few steps, but it can never exceed what the request holds.
    assert blocks // 2 < measured <= blocks
    assert "after the request ended 0.0000%" in text
    hits, queries = map(float, re.search(r"server: (\d+) of (\d+) prompt tokens served from the prefix cache",
                                         text).groups())
    assert 0 < hits < queries  # the warm requests hit, the cold ones did not
    assert re.search(r"the server took [1-9][\d.]*% of [\d,]+ prompt tokens from the prefix cache", text)
    assert re.search(r"\[(shown|not shown|within noise)\] TTFT grows with the prompt: TTFT went from", text)
    assert re.search(r"\[(shown|not shown)\] TPOT hardly moves with the prompt: TPOT went from", text)
    # Go deeper's checks print in their own cells (the summary holds the core path's): cold vs warm, the pool's blocks
    assert re.search(r"a warm prefix cuts TTFT\n  (✔|✘|~) [^:]*: TTFT [\d,]+ ms cold", text)
    for config in ("max-num-batched-tokens 2048 (default)", "max-num-batched-tokens 256"):  # both measured
        assert f"{config}: the long prefill stalls the running streams" in text
    assert re.search(r"a smaller prefill chunk makes the long request's own TTFT longer\n  (✔|✘|~) [^:]*: the long "
                     r"prompt's prefill took [\d,]+ ms", text)
    assert " nan ms" not in text and "steady gap of nan" not in text
    # section 4 and Go deeper: continuous batching, PagedAttention's blocks and preemption, each checked against this run
    assert "the stall section's runs on the small pool preempted 0 request(s)" in text  # the pool held them
    assert re.search(r"\[(shown|not shown)\] a request arriving mid-decode joins the running batch at the next engine "
                     r"step: the late request arrived while the early one decoded: (it waited [\d.,]+ ms in the "
                     r"server's queue = [\d.]+ engine steps|its wait for a step is not isolated here)", text)
    # (not isolated: the server's queue-time histogram counted another request in the window too; the first token's
    # time after the send and the gauges decide the check then)
    assert re.search(r"\[(shown|not shown)\] the running request barely pauses while the new one joins", text)
    matched, samples = map(int, re.search(r"KV blocks are allocated as a sequence grows, one block per block_size "
                                          r"tokens\n  (?:✔|✘|~) [^:]*: (\d+) of (\d+) samples", text).groups())
    assert samples > 0 and matched <= samples
    preemptions = int(re.search(r"when the KV blocks run out, the scheduler preempts a request and recomputes it later"
                                r"\n  ✔ seen in this run: 4 requests needing \d+ blocks .* preempted (\d+) time",
                                text).group(1))
    assert preemptions > 0
    assert "engine back on the flags it had before the stall section: True" in text
    assert lab.engine.is_ready() and flag_value(lab.engine.args(), "--max-num-batched-tokens") is None
