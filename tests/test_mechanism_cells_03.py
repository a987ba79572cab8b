"""Notebook 03's mechanism cells (tag ``mechanism``) against the helpers that take over from them: the generation loop
with and without the KV cache (``timed_generation``), attention by hand (``attention_by_hand``) and the prefix cache's
block-hash chain (``prefix_hash.block_hashes``). Each cell's own source runs in a fresh namespace holding only what the
notebook has when the cell runs, on two inputs, one an edge case (a one-token prompt; two tokens on the last layer's
last head; a prompt shorter than one block). The chain is also checked against vLLM's own code (``hash_block_tokens``)
and against the hashes a live vLLM publishes in its KV events (``--kv-events-config``): its metrics carry none."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace

import pytest

import notebook_cells
from helpers.core.settings import models_dir
from helpers.lab.notebooks import NOTEBOOK_DIR
from helpers.lessons.l03 import attention, prefix_hash
from helpers.lessons.l03.generation_loop import load_model, timed_generation

NOTEBOOK = NOTEBOOK_DIR / "03_prefill_decode_kv_cache.ipynb"


def mechanism_cells() -> list[str]:
    return [c.source for c in notebook_cells.tagged_cells(NOTEBOOK, "mechanism")]


def cell(marker: str) -> str:
    [source] = [s for s in mechanism_cells() if marker in s]
    return source


def run_cell(source: str, **names) -> dict:
    return notebook_cells.run_cells(source, **names)


@pytest.fixture(scope="module")
def tiny():
    return load_model(models_dir() / "tiny-agent")


def test_there_are_three_mechanism_cells_of_10_to_25_lines_that_do_not_call_the_helpers():
    sources = mechanism_cells()
    assert len(sources) == 3
    for source in sources:
        assert 10 <= len(source.strip().splitlines()) <= 25, source[:80]
        assert "from helpers" not in source and "import helpers" not in source
    for helper in ("timed_generation(", "compare_loops(", "attention_by_hand(", "prefix_hash."):
        assert not any(helper in source for source in sources), helper


# ---------------------------------------------------------------- the generation loop

@pytest.mark.parametrize("prompt_tokens, new_tokens", [(24, 8), (1, 2)], ids=["24-token prompt", "one-token prompt"])
def test_the_loop_cell_chooses_the_helpers_tokens_with_and_without_the_cache(tiny, prompt_tokens, new_tokens, capsys):
    model, tokenizer = tiny
    prompt = tokenizer(" ".join(["the weather in Paris is sunny"] * 10))["input_ids"][:prompt_tokens]
    out = run_cell(cell("def generate("), model=model, loop_prompt=prompt, NAIVE_NEW_TOKENS=new_tokens)
    for rows, use_cache in ((out["with_cache"], True), (out["without"], False)):
        helper = timed_generation(model, prompt, new_tokens, use_cache=use_cache, progress=False)
        assert [r["token"] for r in rows] == helper["token"].tolist()
        assert [r["context_tokens"] for r in rows] == helper["context_tokens"].tolist()
        assert [r["step"] for r in rows] == list(range(new_tokens)) and all(r["step_s"] > 0 for r in rows)
    assert [r["token"] for r in out["with_cache"]] == [r["token"] for r in out["without"]]


# ---------------------------------------------------------------- attention by hand

def _attention_cell(ids: list[int]) -> str:
    source = cell("apply_rotary_pos_emb")
    line = next(line for line in source.splitlines() if line.startswith("short_ids = "))
    return source.replace(line, f"short_ids = {ids!r}")


@pytest.mark.parametrize("case", ["a sentence, layer 0 head 0", "two tokens, the last layer's last head"])
def test_the_attention_cell_computes_the_helpers_matrix(tiny, case, capsys):
    model, tokenizer = tiny
    if case.startswith("two"):
        ids = tokenizer("the weather")["input_ids"][:2]
        layer, head = model.config.num_hidden_layers - 1, model.config.num_attention_heads - 1  # the second key head
    else:
        ids = tokenizer("the weather in Paris is sunny and the time in Tokyo is late")["input_ids"]
        layer, head = 0, 0
    assert len(ids) == 2 or len(ids) > 8
    out = run_cell(_attention_cell(ids), model=model, tokenizer=tokenizer, ATTENTION_LAYER=layer, ATTENTION_HEAD=head)
    weights = out["weights"].numpy()
    helper = attention.attention_by_hand(model, tokenizer, ids, layer, head)
    assert weights.shape == (len(ids), len(ids))
    assert abs(weights - helper.weights).max() < 1e-5
    matrix = attention.ScoreMatrix(weights, tokenizer.convert_ids_to_tokens(ids), layer, head)
    assert attention.conclude_score_matrix(matrix, attention.model_attention(model, ids, layer, head)).verdict == "shown"


# ---------------------------------------------------------------- the block-hash chain

def _hash_cell(block_size: int, break_at: int) -> dict:
    return run_cell(cell("def block_hashes("), cache={"block_size": block_size}, BREAK_AT_TOKEN=break_at)


@pytest.mark.parametrize("block_size, break_at", [(16, 5), (128, 200)], ids=["block 16, first block", "block 128, second"])
def test_the_hash_cell_gives_the_helpers_chain_and_a_change_breaks_every_later_block(block_size, break_at, capsys):
    out = _hash_cell(block_size, break_at)
    printed = capsys.readouterr().out.splitlines()
    mine = out["block_hashes"]
    assert mine(out["prompt"], block_size) == prefix_hash.block_hashes(out["prompt"], block_size)
    assert len(mine(out["prompt"], block_size)) == 4  # four full blocks; the half block gets no hash
    first_changed = break_at // block_size
    assert [line.endswith("changed") for line in printed] == [i >= first_changed for i in range(4)]
    assert prefix_hash.shared_blocks(mine(out["prompt"], block_size), mine(out["changed"], block_size)) == first_changed


def test_a_prompt_shorter_than_one_block_has_no_hash(capsys):
    mine = _hash_cell(16, 5)["block_hashes"]
    assert mine(list(range(15)), 16) == prefix_hash.block_hashes(list(range(15)), 16) == []
    assert len(mine(list(range(16)), 16)) == 1 and mine([7], 1) == prefix_hash.block_hashes([7], 1)


def test_the_chain_is_vllms_own():
    """The helper (and so the cell) against vLLM's hash_block_tokens with its default sha256 and NONE_HASH."""
    kv_cache_utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    from vllm.utils.hashing import sha256

    if os.environ.get("PYTHONHASHSEED") is not None:
        pytest.skip("PYTHONHASHSEED is set: vLLM's chain then starts from that seed")
    kv_cache_utils.init_none_hash(sha256)
    ids, parent, theirs = list(range(500, 900)), None, []
    for start in range(0, len(ids) - 127, 128):
        parent = kv_cache_utils.hash_block_tokens(sha256, parent, ids[start:start + 128])
        theirs.append(parent)
    assert prefix_hash.block_hashes(ids, 128) == theirs and len(theirs) == 3


def test_the_predicted_hits_follow_the_chain():
    block = 4
    base = list(range(20))  # five full blocks
    changed = base[:6] + [99] + base[7:]  # block 1 changed: only block 0 reusable
    warm_tail, short = base[:17] + [55, 56], base[:4]
    hits = prefix_hash.predicted_hits([(base, []), (warm_tail, []), (changed, []), (short, [])], block)
    assert hits == [0, 16, 4, 0]  # at most len - 1 tokens: the four-token prompt reuses no block of its own length
    # vLLM stops at the first block it misses, so the count cannot tell a chain from hashes that leave out their parent
    # (the KV events test below can): the check that the learner's function is the chain is same_chain
    no_parent = lambda ids, size: [hash(tuple(ids[s:s + size])) for s in range(0, len(ids) - size + 1, size)]  # noqa: E731
    assert prefix_hash.predicted_hits([(base, []), (changed, [])], block, no_parent) == [0, 4]
    assert not prefix_hash.same_chain(no_parent, base, block) and prefix_hash.same_chain(prefix_hash.block_hashes, base, 4)
    # the generated tokens' full blocks are cached too: a prompt that repeats a prompt and its answer reuses both
    assert prefix_hash.predicted_hits([(base[:6], base[6:12]), (base[:13], [])], block) == [0, 12]


def test_the_prediction_conclusion_both_ways():
    import pandas as pd

    def rows(predicted, counted):
        return pd.DataFrame({"predicted_cached_tokens": predicted, "cached_tokens": counted})

    assert prefix_hash.conclude_prediction(rows([0, 1920, 0], [0, 1920, 0])).verdict == "shown"
    over = prefix_hash.conclude_prediction(rows([0, 1920, 1792], [0, 1920, 0]))
    assert over.verdict == "not shown" and "matched blocks vLLM did not" in over.text
    unknown = prefix_hash.conclude_prediction(rows([float("nan")] * 3, [0, 1920, 0]))
    assert unknown.verdict == "not shown" and "nothing to compare" in unknown.text


# ---------------------------------------------------------------- against a live vLLM's KV events

EVENTS_PORT = os.environ.get("WORKSHOP_KV_EVENTS_TEST_PORT", "8769")


@pytest.fixture(scope="module")
def events_lab(tmp_path_factory):
    """An engine of its own, not the suite's shared one: it publishes KV events (--kv-events-config) to a ZMQ socket
    this test binds (an endpoint with a host makes vLLM's publisher connect to it)."""
    pytest.importorskip("vllm")  # the engine, and its KV event types
    zmq = pytest.importorskip("zmq")
    from fakes import engine_environment
    from helpers.core.settings import load_settings
    from helpers.engine.interface import default_config
    from helpers.engine.session import Lab, make_client, make_engine

    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    zmq_port = sub.bind_to_random_port("tcp://127.0.0.1")
    sub.setsockopt_string(zmq.SUBSCRIBE, "")
    events = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                         "endpoint": f"tcp://127.0.0.1:{zmq_port}"})
    with engine_environment(EVENTS_PORT, tmp_path_factory.mktemp("kv-events-engine")):
        settings = load_settings()
        engine = make_engine(settings)
        config = default_config(settings)
        engine.start(replace(config, args=(*config.args, "--kv-events-config", events)))
        try:
            yield Lab(settings, engine, make_client(settings)), sub
        finally:
            engine.stop()
            sub.close(linger=0)
            context.term()


@pytest.mark.engine
def test_the_cells_hashes_are_the_ones_vllm_publishes(events_lab, capsys):
    from vllm.distributed.kv_events import BlockStored, KVEventBatch
    import msgspec
    import zmq

    from helpers.measure.stream_timing import stream_chat

    lab, sub = events_lab
    frames: list[list[bytes]] = []
    done = threading.Event()

    def listen() -> None:
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        while not done.is_set():
            if poller.poll(100):
                frames.append(sub.recv_multipart())

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    client = prefix_hash.TokenIds(lab.client)
    words = " ".join(f"w{i}" for i in range(400))  # a prompt new to this engine
    timing = stream_chat(client, lab.model, [{"role": "user", "content": words}], max_tokens=140,
                         extra_body={"ignore_eos": True, "min_tokens": 140})
    time.sleep(2.0)  # the publisher sends after the step
    done.set()
    listener.join()
    assert timing.ok and client.prompt_ids and len(client.output_ids) == 140
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    stored = [e for f in frames for e in decoder.decode(f[-1]).events if isinstance(e, BlockStored)]
    published = [h for e in stored for h in e.block_hashes]
    block = stored[0].block_size
    mine = run_cell(cell("def block_hashes("), cache={"block_size": block}, BREAK_AT_TOKEN=5)["block_hashes"]
    chain = [prefix_hash.external_hash(h) for h in mine(client.prompt_ids + client.output_ids, block)]
    assert published == chain and len(chain) >= 2  # every full block, the generated tokens' included, in order
    first = 0  # each event stores a run of blocks and names the hash of the block before it (None for the first)
    for event in stored:
        assert event.parent_block_hash == (chain[first - 1] if first else None)
        assert event.token_ids == (client.prompt_ids + client.output_ids)[first * block:(first + len(event.block_hashes)) * block]
        first += len(event.block_hashes)
