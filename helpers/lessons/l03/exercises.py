"""Notebook 03's code exercise: the KV blocks a request of N tokens holds at block size B (ceil(N / B)).

``blocks_check`` tries the learner's function on a few (tokens, block size) pairs and returns the sentence that says
what is wrong (None when it is right), for ``check_exercise``; ``blocks_on_this_run`` says what the answer means for
this run's requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

BLOCKS_HINT = ("a block holds block_size tokens, and a request's last block is allocated as soon as one token lands "
               "in it: divide, then round up (math.ceil), and 0 tokens hold no block.")

# (tokens, block_size): one token, one past a block, exactly one block, the CPU build's block size at an exact multiple
# and one past it, a long request, and an empty one (in this order, so each usual mistake meets the case that names it)
CASES = ((1, 16), (17, 16), (16, 16), (256, 128), (257, 128), (3300, 128), (0, 16))


def blocks_needed(tokens: int, block_size: int) -> int:
    """The KV blocks a request of ``tokens`` tokens holds: ceil(tokens / block_size)."""
    return -(-tokens // block_size)


def _blocks(n: int) -> str:
    return f"{n} block" + ("" if n == 1 else "s")


def blocks_check(answer: Any) -> str | None:
    """What is wrong with the learner's ``my_blocks(tokens, block_size)``, or None when it gives ceil(N / B) on every
    case."""
    if not callable(answer):
        return f"my_blocks should be a function of (tokens, block_size), not {type(answer).__name__}."
    for tokens, size in CASES:
        want = blocks_needed(tokens, size)
        try:
            got = answer(tokens, size)
        except Exception as err:  # noqa: BLE001 - the learner's code: say what it raised
            return f"my_blocks({tokens}, {size}) raised {type(err).__name__}: {err}."
        whole = isinstance(got, int) or isinstance(got, float) and got.is_integer()
        if isinstance(got, bool) or not whole:
            return (f"my_blocks({tokens}, {size}) returned {got!r}: a request holds a whole number of blocks "
                    "(an int).")
        if got == want:
            continue
        said = (f"{tokens} token{'' if tokens == 1 else 's'} at block_size {size} hold {_blocks(want)}, but yours says "
                f"{got:g}")
        if got == tokens // size:
            return said + ": the last, partly filled block is a whole block too (round up, not down)."
        if got == want + 1:
            return said + (": a request with no token holds no block." if tokens == 0 else
                           ": a request that fills its blocks exactly needs no extra one until its next token."
                           if tokens % size == 0 else ": one block too many (vLLM's null block belongs to the pool, "
                           "not to a request).")
        return said + "."
    return None


def blocks_on_this_run(requests: Sequence[tuple[str, int]], block_size: int) -> str:
    """The right answer applied to this run's requests ((name, tokens) each): the blocks each held at its longest."""
    parts = []
    for name, tokens in requests:
        left = tokens % block_size
        last = "the last one full" if left == 0 else f"the last holding {left} of its {block_size}"
        parts.append(f"the {name} ended with {tokens:,} tokens in {_blocks(blocks_needed(tokens, block_size))} "
                     f"({last})" if tokens else f"the {name} held no token and no block")
    return ("In this run " + "; ".join(parts) + ".") if parts else ""
