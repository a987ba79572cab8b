"""benchmarks/chunks_per_answer.py's counting, without an engine: a vLLM detailed result's chunks per answer."""

from __future__ import annotations

from pathlib import Path

from script_module import load_script

bench = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "chunks_per_answer.py")


def test_a_vllm_answer_has_one_chunk_more_than_its_gaps_and_a_failed_one_none():
    result = {"itls": [[0.01, 0.02, 0.01], [], None, [0.5]]}  # three gaps; one chunk alone; none kept; two
    assert bench.vllm_chunks(result) == [4, 1, 2]
    failed = {"itls": [[0.01], [], [0.2, 0.3]], "errors": ["", "HTTP 500", ""]}
    assert bench.vllm_chunks(failed) == [2, 3]
    assert bench.vllm_chunks({}) == []


def test_the_description_names_mean_min_max_and_count():
    assert bench.describe([4, 1, 2]) == "chunks per answer: mean   2.3, min 1, max 4 (3 answers)"
    assert bench.describe([]) == "no answers"
