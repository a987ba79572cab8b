"""The code exercises of notebooks 01 (TPOT from the recorded chunks) and 02 (KV bytes per token from config.json), run
from the notebooks' own cells (tags ``exercise`` and ``solution``, no engine): the worked solution passes its check in
names of its own (the learner's answer left alone, nothing marked right), a wrong answer fails with the sentence that
says what is wrong and the hint, and the learner's ``None`` asks for an answer without failing and without the hint.
The solution cell is collapsed in JupyterLab."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fakes import recorded_stream
from notebook_cells import run_cells as run, tagged, with_answer
from helpers.lessons.l01_connect import TPOT_HINT, tpot_check
from helpers.lessons.l02_memory import KV_BYTES_HINT, kv_bytes_check
from helpers.planning.kv import kv_cache_bytes
from helpers.planning.shape import REFERENCE_CONFIGS, load_config

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NB01, NB02 = NOTEBOOKS / "01_connect_and_first_agent.ipynb", NOTEBOOKS / "02_units_and_memory_budget.ipynb"


# ---------------------------------------------------------------- 01: TPOT from the chunk times

def timing_with_a_multi_token_chunk():
    # sent at 0; first token at 0.120 s; a chunk of 3 tokens at 0.200; then one a chunk: 8 tokens in 6 chunks
    return recorded_stream([(0.120, 1, "a"), (0.150, 2, "b"), (0.200, 5, "cde"), (0.230, 6, "f"), (0.260, 7, "g"),
                            (0.290, 8, "h")])


def test_01_the_worked_solution_passes_and_leaves_the_answer_alone(capsys):
    timing = timing_with_a_multi_token_chunk()
    space = run(tagged(NB01, "exercise").source, tagged(NB01, "solution").source, timing=timing)
    assert space["solution_tpot_s"] == pytest.approx(timing.tpot_s) == pytest.approx(0.170 / 7)
    assert space["my_tpot_s"] is None  # "Run All" leaves the learner's answer as written
    out = capsys.readouterr().out
    assert "The worked solution (TPOT from the chunks): 24.29 ms per token" in out and "right" not in out


def test_01_none_asks_for_an_answer_without_the_hint(capsys):
    result = run(tagged(NB01, "exercise").source, timing=timing_with_a_multi_token_chunk())
    assert result["my_tpot_s"] is None
    out = capsys.readouterr().out
    assert "Your turn (TPOT from the chunks): replace the None" in out
    assert "Hint" not in out and TPOT_HINT not in out


@pytest.mark.parametrize("answer, says", [
    ("(timing.chunk_times[-1] - timing.chunk_times[0]) / (len(timing.chunk_times) - 1)", "you divided by the 6 chunks"),
    ("(timing.chunk_times[-1] - timing.chunk_times[0]) / sum(timing.chunk_tokens)", "you divided by all 8 tokens"),
    ("(timing.chunk_times[-1] - timing.t_sent) / (sum(timing.chunk_tokens) - 1)", "the TTFT (prefill) is in it"),
    ("1000 * (timing.chunk_times[-1] - timing.chunk_times[0]) / 7", "in milliseconds"),
    ("0.5", "500 ms per token is not this run's TPOT"),
    ("'fast'", "must be a number of seconds, not str"),
], ids=["chunks", "all-tokens", "from-sent", "ms", "other", "text"])
def test_01_a_wrong_answer_fails_with_what_is_wrong(answer, says):
    source = with_answer(tagged(NB01, "exercise").source, "my_tpot_s", answer)
    with pytest.raises(AssertionError, match=re.escape(says)) as failed:
        run(source, timing=timing_with_a_multi_token_chunk())
    assert "Hint: the decode runs from the first chunk" in str(failed.value)


def test_01_a_run_of_one_token_says_its_tpot_is_undefined():
    assert "TPOT is undefined" in tpot_check(recorded_stream([(0.1, 1, "a")]))(0.01)


# ---------------------------------------------------------------- 02: KV bytes per token from config.json

def config_fields(model: str = "Qwen3-4B") -> dict:
    cfg = load_config(REFERENCE_CONFIGS / f"{model}.json")
    H, n_q = cfg["hidden_size"], cfg["num_attention_heads"]
    return {"L": cfg["num_hidden_layers"], "n_q": n_q, "n_kv": cfg["num_key_value_heads"],
            "d": cfg.get("head_dim") or H // n_q, "CONVERSATION_TOKENS": 8192, "GIB": 2**30}


def test_02_the_worked_solution_passes_matches_the_planner_and_leaves_the_answer_alone(capsys):
    space = run(tagged(NB02, "exercise").source, tagged(NB02, "solution").source, **config_fields())
    assert space["solution_kv_bytes"] == kv_cache_bytes(REFERENCE_CONFIGS / "Qwen3-4B.json").bytes_per_token == 147_456
    assert space["kv_bytes_by_hand"] is None  # "Run All" leaves the learner's answer as written
    out = capsys.readouterr().out
    assert "The worked solution (KV bytes per token): by hand, 147,456 bytes of KV cache per token" in out
    assert "right" not in out


def test_02_none_asks_for_an_answer_without_the_hint(capsys):
    assert run(tagged(NB02, "exercise").source, **config_fields())["kv_bytes_by_hand"] is None
    out = capsys.readouterr().out
    assert "Your turn (KV bytes per token): replace the None" in out
    assert "Hint" not in out and KV_BYTES_HINT not in out


@pytest.mark.parametrize("answer, says", [
    ("2 * L * n_q * d * 2", "uses the 32 query heads: with grouped-query attention only the 8 KV heads"),
    ("L * n_kv * d * 2", "that is half: a key and a value are cached for each head (x 2). Or that counts numbers"),
    ("2 * L * n_kv * d", "Or that counts numbers, not bytes: each is 2 bytes in BF16."),
    ("2 * L * n_kv * d * 4", "FP32"),
    ("2 * n_kv * d * 2", "one layer's worth: each of the 36 layers"),
    ("12345", "12,345 bytes per token is not it"),
    ("None or 'a lot'", "must be a number of bytes, not str"),
], ids=["query-heads", "no-v", "numbers", "fp32", "one-layer", "other", "text"])
def test_02_a_wrong_answer_fails_with_what_is_wrong(answer, says):
    source = with_answer(tagged(NB02, "exercise").source, "kv_bytes_by_hand", answer)
    with pytest.raises(AssertionError, match=re.escape(says)) as failed:
        run(source, **config_fields())
    assert "Hint: every layer keeps" in str(failed.value)


def test_02_without_grouped_query_attention_the_query_heads_are_right():
    # n_q == n_kv: counting the query heads is no mistake there
    assert kv_bytes_check(layers=4, query_heads=8, kv_heads=8, head_dim=64)(2 * 4 * 8 * 64 * 2) is None
