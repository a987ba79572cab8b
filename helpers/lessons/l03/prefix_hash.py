"""The prefix cache's block-hash chain, as vLLM computes it, and the token ids it is computed over.

vLLM's prefix cache finds a prompt's blocks by hash: each FULL block of ``block_size`` tokens gets
sha256((the previous block's hash, the block's token ids, extra keys)), the first block's "previous hash" being a
fixed root (``hash_block_tokens`` and ``init_none_hash`` in vllm/v1/core/kv_cache_utils.py; sha256 of the pickled
tuple is vLLM's default ``--prefix-caching-hash-algo``, vllm/utils/hashing.py). The root is the sha256 of the seed
"vllm-none-hash", or of ``$PYTHONHASHSEED`` where the engine's environment sets it. The extra keys are None for a
text request without a LoRA adapter, an image or a ``cache_salt``. A partial last block gets no hash. Because each
hash covers its parent, one changed token changes its own block's hash and every hash after it.

What vLLM reports of these hashes: its Prometheus metrics carry none (only the hit and query counters, in tokens);
its KV events do (``--kv-events-config``, published over ZMQ: each ``BlockStored`` event carries the block hashes,
their parent's hash and the token ids, the hashes as the low 64 bits of the digest by default,
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``; ``external_hash`` turns a digest into that form). The notebook's engine runs
without them (a restart, and a ZMQ port the cluster's Service does not expose), so notebook 03 checks the chain
against the counter: the prompt tokens a request finds cached are block_size x the leading blocks whose hashes an
earlier request left in the cache (``predicted_hits``). tests/test_mechanism_cells_03.py checks the hashes against
the KV events of a live engine.

``TokenIds`` wraps the OpenAI client for ``stream_chat`` so that a streamed chat request also keeps the token ids
vLLM returns (``return_token_ids``): the prompt's as the server tokenized it, chat template included, and each
generated token's.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

NONE_HASH_SEED = "vllm-none-hash"  # DEFAULT_NONE_HASH_SEED in vllm/v1/core/kv_cache_utils.py (no PYTHONHASHSEED)

Hasher = Callable[[Sequence[int], int], list[bytes]]


def _sha256(obj: Any) -> bytes:
    """vLLM's ``sha256``: the digest of the object pickled with the highest protocol."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def block_hashes(token_ids: Sequence[int], block_size: int, seed: str = NONE_HASH_SEED) -> list[bytes]:
    """One sha256 digest per full block of ``token_ids``, each over (its parent's digest, its tokens, None)."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    parent, hashes = _sha256(seed), []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = _sha256((parent, tuple(token_ids[start:start + block_size]), None))
        hashes.append(parent)
    return hashes


def external_hash(digest: bytes) -> int:
    """A block hash as vLLM's KV events publish it by default: the digest's low 64 bits, big-endian."""
    return int.from_bytes(digest, byteorder="big") & ((1 << 64) - 1)


def short(digest: bytes, digits: int = 6) -> str:
    """The first ``digits`` hex digits of a digest, for a label."""
    return digest.hex()[:digits]


def shared_blocks(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    """How many leading hashes two chains share: the blocks a prompt reuses from the other."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def predicted_hits(requests: Sequence[tuple[Sequence[int], Sequence[int]]], block_size: int,
                   hasher: Hasher = block_hashes) -> list[int]:
    """For requests sent one after another, each (its prompt's token ids, its generated ids), the prompt tokens each
    finds in the prefix cache: block_size x its leading blocks whose hashes an earlier request stored (generated
    tokens fill blocks that are cached too). vLLM computes at least a prompt's last token, so a hit covers at most
    len(prompt) - 1 tokens (``max_length`` in ``find_longest_cache_hit``). The cache starts empty and evicts nothing."""
    seen: set[bytes] = set()
    out = []
    for prompt, generated in requests:
        prompt = list(prompt)
        hits = 0
        for h in hasher(prompt, block_size)[:max(0, (len(prompt) - 1) // block_size)]:
            if h not in seen:
                break
            hits += 1
        out.append(hits * block_size)
        seen.update(hasher(prompt + list(generated), block_size))
    return out


def same_chain(hasher: Hasher, token_ids: Sequence[int], block_size: int) -> bool:
    """Does ``hasher`` (a learner's function) give this module's hashes for ``token_ids``?"""
    return list(hasher(token_ids, block_size)) == block_hashes(token_ids, block_size)


class TokenIds:
    """An OpenAI client stand-in for ``stream_chat`` that asks vLLM for the token ids (``return_token_ids``) and keeps
    those of the last streamed request: ``prompt_ids`` (as the server tokenized the messages, chat template included;
    None when the server returned none) and ``output_ids`` (each generated token's)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.prompt_ids: list[int] | None = None
        self.output_ids: list[int] = []

    @property
    def chat(self) -> "TokenIds":
        return self

    @property
    def completions(self) -> "TokenIds":
        return self

    def create(self, **kwargs: Any) -> Iterator[Any]:
        """``chat.completions.create`` with ``return_token_ids`` added; the stream's chunks pass through unchanged."""
        kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), "return_token_ids": True}
        self.prompt_ids, self.output_ids = None, []
        return self._keep(self._client.chat.completions.create(**kwargs))

    def _keep(self, stream: Any) -> Iterator[Any]:
        for chunk in stream:
            extra = getattr(chunk, "model_extra", None) or {}
            if self.prompt_ids is None and extra.get("prompt_token_ids"):
                self.prompt_ids = list(extra["prompt_token_ids"])
            for choice in getattr(chunk, "choices", None) or []:
                ids = (getattr(choice, "model_extra", None) or {}).get("token_ids")
                if ids:
                    self.output_ids.extend(int(i) for i in ids)
            yield chunk


def conclude_prediction(requests: Any) -> Any:
    """The prompt tokens the chain predicted each request found cached (``predicted_cached_tokens`` of
    ``measure_break_cache``) against the server's counter (``cached_tokens``): equal, request by request?"""
    from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion

    expectation = "the block-hash chain predicts the prompt tokens the server found cached"
    predicted = requests["predicted_cached_tokens"]
    if predicted.isna().any():
        return Conclusion("the server returned no token ids (return_token_ids), so the chain could not be computed "
                          "over this run's prompts: nothing to compare.", NOT_SHOWN, expectation)
    pairs = list(zip(predicted.astype(int), requests["cached_tokens"].astype(int)))
    text = ("the hashes of the token ids the server returned predicted " + " / ".join(f"{p:,}" for p, _ in pairs)
            + " cached prompt tokens (cold / warm / changed), the server's vllm:prefix_cache_hits counted "
            + " / ".join(f"{c:,}" for _, c in pairs))
    if all(p == c for p, c in pairs):
        return Conclusion(text + ": equal, block for block.", SHOWN, expectation)
    over = any(p > c for p, c in pairs)
    return Conclusion(text + (": the chain predicted more than the server reused, so it matched blocks vLLM did not "
                              "(vLLM reuses full blocks only, up to the prompt's last token)" if over else
                              ": the server reused more than the chain predicted (another request had cached these "
                              "blocks, or the blocks were cut where vLLM does not cut them)") + ".", NOT_SHOWN,
                      expectation)
