"""Notebook 03's code exercise, the KV blocks a request holds: the learner's cell (tag ``exercise``) asks without failing
and without the hint while the answer is None, the worked solution (tag ``solution``, collapsed) passes in a name of its
own (the learner's answer left alone, nothing marked right) and says what it means for this run, and wrong answers fail
with a sentence that says what is wrong and the hint. The cells' own source runs here, on a join result built from
plain numbers (no engine)."""

from __future__ import annotations

import nbformat
import pandas as pd
import pytest

import notebook_cells
from helpers.lab.notebooks import NOTEBOOK_DIR
from helpers.lessons.l03 import batching
from helpers.lessons.l03.exercises import BLOCKS_HINT, blocks_check, blocks_needed
from helpers.measure.stream_timing import StreamTiming

NOTEBOOK = NOTEBOOK_DIR / "03_prefill_decode_kv_cache.ipynb"


def tagged(tag: str) -> nbformat.NotebookNode:
    return notebook_cells.tagged(NOTEBOOK, tag)


def _stream(prompt: int, output: int, start: float) -> StreamTiming:
    times = [start + 0.1 + 0.01 * i for i in range(output)]
    return StreamTiming(t_sent=start, t_first_token=times[0], chunk_times=times, chunk_tokens=[1] * output,
                        prompt_tokens=prompt, completion_tokens=output, t_done=times[-1] + 0.01)


def run(source: str) -> dict:
    joined = batching.JoinResult(_stream(110, 286, 0.0), _stream(110, 18, 1.0), pd.DataFrame())  # 396 and 128 tokens
    namespace = {"batching": batching, "joined": joined, "cache": {"block_size": 128}}
    exec(compile(source, "03 exercise", "exec"), namespace)  # noqa: S102 - the shipped cells
    return namespace


def test_the_exercise_asks_without_the_hint_and_does_not_fail_before_it_is_written(capsys):
    assert run(tagged("exercise").source)["my_blocks"] is None
    out = capsys.readouterr().out
    assert out.startswith("Your turn (the KV blocks of a request): replace the None")
    assert "Hint" not in out and BLOCKS_HINT not in out


def test_the_worked_solution_passes_and_says_what_this_run_saw(capsys):
    cell = tagged("solution")
    assert cell.metadata["jupyter"]["source_hidden"] is True  # collapsed in JupyterLab
    space = run(tagged("exercise").source + "\n\n" + cell.source)  # the exercise first, as a top-to-bottom run has it
    assert space["my_blocks"] is None and blocks_check(space["solution_blocks"]) is None  # the learner's left alone
    out = capsys.readouterr().out.splitlines()[-1]
    assert out == ("The worked solution (the KV blocks of a request): In this run the early request ended with 396 "
                   "tokens in 4 blocks (the last holding 12 of its 128); the late request ended with 128 tokens in 1 "
                   "block (the last one full).")


def _answer_cell(answer: str) -> str:
    """The exercise cell with the learner's line written."""
    source = tagged("exercise").source
    line = next(line for line in source.splitlines() if line.startswith("my_blocks = None"))
    return source.replace(line, answer)


@pytest.mark.parametrize("answer, says", [
    ("my_blocks = lambda tokens, block_size: tokens // block_size",
     "1 token at block_size 16 hold 1 block, but yours says 0: the last, partly filled block is a whole block too"),
    ("my_blocks = lambda tokens, block_size: tokens // block_size + 1",
     "16 tokens at block_size 16 hold 1 block, but yours says 2: a request that fills its blocks exactly needs no "
     "extra one"),
    ("my_blocks = lambda tokens, block_size: tokens / block_size",
     "my_blocks(1, 16) returned 0.0625: a request holds a whole number of blocks"),
    ("my_blocks = lambda tokens, block_size: -(-tokens // block_size) + 1",  # the null block counted
     "one block too many (vLLM's null block belongs to the pool"),
    ("my_blocks = lambda tokens, block_size: max(1, -(-tokens // block_size))",
     "0 tokens at block_size 16 hold 0 blocks, but yours says 1: a request with no token holds no block."),
    ("my_blocks = lambda tokens, block_size: round(tokens / block_size)",
     "1 token at block_size 16 hold 1 block, but yours says 0"),
    ("my_blocks = 4", "my_blocks should be a function of (tokens, block_size), not int."),
    ("my_blocks = lambda tokens: tokens", "my_blocks(1, 16) raised TypeError"),
])
def test_a_wrong_answer_fails_with_what_is_wrong_and_the_hint(answer, says):
    with pytest.raises(AssertionError) as info:
        run(_answer_cell(answer))
    message = str(info.value)
    assert message.startswith("the KV blocks of a request: ") and says in message
    assert message.endswith("Hint: " + BLOCKS_HINT)


def test_the_reference_is_the_block_count_the_lesson_checks_against_the_gauge():
    """The exercise's answer is what batching (the PagedAttention step) and kv_cache (the long request) count."""
    from helpers.lessons.l03.kv_cache import expected_blocks

    for tokens, size in ((1, 16), (16, 16), (17, 16), (3300, 128)):
        assert blocks_needed(tokens, size) == batching.blocks_needed(tokens, size) == expected_blocks(tokens, size)
    assert blocks_check(lambda tokens, block_size: batching.blocks_needed(tokens, block_size)) is None
