"""The code exercises of notebooks 04 (the MoE's batch-1 decode ceiling from its active parameters) and 05 (a weight
matrix's bytes in INT4 with group scales), run from the notebooks' own cells (tags ``exercise`` and ``solution``, no
engine): the worked solution passes its check under its own names (``solution_...``: "Run All" leaves the learner's
answer alone and marks nothing right), each likely slip fails with the sentence that says what is wrong and the hint,
and the learner's ``None`` asks for an answer without failing and without the hint (a hint comes after a wrong attempt,
never before one). The solution cell is collapsed in JupyterLab."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from notebook_cells import run_cells as run, tagged, with_answer
from helpers.core.settings import models_dir
from helpers.hardware.gpus import get_gpu
from helpers.lessons.l04_moe import MOE_CEILING_HINT, REFERENCE_CONFIGS, ceiling_key, count_params, paper_table
from helpers.lessons.l05_quantize_by_hand import INT4_HINT, checkpoint_tensor_bytes, int4_bytes

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NB04, NB05 = NOTEBOOKS / "04_dense_vs_moe.ipynb", NOTEBOOKS / "05_quantization.ipynb"


# ---------------------------------------------------------------- 04: the MoE's batch-1 decode ceiling

def names_04(gpu: str = "RTX 4000 Ada") -> dict:
    dense, moe = (count_params(REFERENCE_CONFIGS / f"{m}.json") for m in ("Qwen3-4B", "Qwen3-30B-A3B"))
    g = get_gpu(gpu)
    return {"gpu": g, "moe_counts": moe, "dense_counts": dense, "ceiling_tok_s": g.bandwidth_gb_s * 1e9 / (dense.total * 2),
            "MOE": "Qwen3-30B-A3B"}


@pytest.mark.parametrize("gpu", ["RTX 4000 Ada", "H100 SXM"])
def test_04_the_worked_solution_passes_and_is_the_tables_ceiling(gpu, capsys):
    names = names_04(gpu)
    space = run(tagged(NB04, "solution").source, **names, my_moe_ceiling_tok_s=12.5)  # the learner's wrong answer
    table = paper_table(["Qwen3-30B-A3B"], names["gpu"])["Qwen3-30B-A3B"]
    assert space["solution_moe_ceiling_tok_s"] == pytest.approx(table[ceiling_key(names["gpu"])])
    assert space["my_moe_ceiling_tok_s"] == 12.5  # the solution leaves the learner's answer as it was
    out = capsys.readouterr().out
    assert out.startswith("The worked solution (the MoE's decode ceiling): ") and "✔" not in out  # not marked right


def test_04_none_asks_for_an_answer_without_the_hint(capsys):
    assert run(tagged(NB04, "exercise").source, **names_04())["my_moe_ceiling_tok_s"] is None
    out = capsys.readouterr().out
    assert "Your turn (the MoE's decode ceiling): replace the None" in out
    assert "Hint" not in out and MOE_CEILING_HINT not in out and "moe_counts.active" not in out


@pytest.mark.parametrize("answer, says", [
    ("gpu.bandwidth_gb_s * 1e9 / (moe_counts.total * 2)", "every expert: at batch 1 a token reads only its 8 experts"),
    ("gpu.bandwidth_gb_s * 1e9 / moe_counts.active", "counts parameters, not bytes"),
    ("gpu.bandwidth_gb_s * 1e9 / (moe_counts.active * 4)", "FP32"),
    ("gpu.bandwidth_gb_s / (moe_counts.active * 2)", "multiply by 1e9"),
    ("gpu.bandwidth_gb_s * 1e9 / (dense_counts.active * 2)", "the dense model's parameters"),
    ("12.5", "12.5 tokens/s is not it"),
    ("'fast'", "must be a number of tokens per second, not str"),
], ids=["total", "params", "fp32", "gb", "dense", "other", "text"])
def test_04_a_wrong_answer_fails_with_what_is_wrong(answer, says):
    source = with_answer(tagged(NB04, "exercise").source, "my_moe_ceiling_tok_s", answer)
    with pytest.raises(AssertionError, match=re.escape(says)) as failed:
        run(source, **names_04())
    assert "Hint: at batch 1 a decode step reads each weight it uses once" in str(failed.value)


# ---------------------------------------------------------------- 05: the bytes of W in INT4 with group scales

W05 = torch.zeros(256, 768)  # tiny-agent's layers.0.mlp.down_proj has this shape; the exercise reads only the shape


def names_05(W=W05, group=128) -> dict:
    return {"W": W, "GROUP_SIZE": group, "MECHANISM_WEIGHT": "model.layers.0.mlp.down_proj.weight",
            "models_dir": models_dir}


def solution_05(W=W05, group=128, **learner) -> dict:
    """The solution cell run after the exercise cell, as in the notebook (it reads the exercise's ``rows, cols``)."""
    return run(tagged(NB05, "exercise").source + "\n" + tagged(NB05, "solution").source, **names_05(W, group),
               **learner)


def test_05_the_worked_solution_passes_and_is_what_the_shipped_w4a16_stores(capsys):
    space = solution_05()
    stored = checkpoint_tensor_bytes(models_dir() / "tiny-agent-w4a16", "model.layers.0.mlp.down_proj")
    assert space["solution_int4_bytes"] == int4_bytes(256, 768, 128) == stored["weight_packed"] + stored["weight_scale"]
    assert space["my_int4_bytes"] is None  # the learner's answer stays theirs
    out = capsys.readouterr().out
    assert "The worked solution (W in INT4): 101,376 bytes against 393,216 in BF16 (3.88x smaller)" in out
    assert "✔" not in out  # a solution marks nothing right
    assert "weight_packed 98,304, weight_scale 3,072" in out


def test_05_another_group_size_and_shape_pass_too(capsys):
    space = solution_05(torch.zeros(64, 256), 32)
    assert space["solution_int4_bytes"] == 64 * 256 // 2 + 64 * 8 * 2


def test_05_none_asks_for_an_answer_and_does_not_fail(capsys):
    assert run(tagged(NB05, "exercise").source, **names_05())["my_int4_bytes"] is None
    out = capsys.readouterr().out
    assert "Your turn (W in INT4): replace the None" in out and "Hint" not in out and INT4_HINT not in out


@pytest.mark.parametrize("answer, says", [
    ("rows * cols // 2", "the packed weights alone: add the scales"),
    ("rows * cols // 2 + rows * (cols // GROUP_SIZE) * 4", "FP32 (4 bytes)"),
    ("rows * cols + rows * (cols // GROUP_SIZE) * 2", "two weights share a byte"),
    ("rows * cols * 4 + rows * (cols // GROUP_SIZE) * 2", "half a byte, not 4 bytes"),
    ("rows * cols // 2 + rows * 2", "one scale per row: a row of 768 has 6 groups"),
    ("rows * cols // 2 + 2", "one scale for the whole matrix"),
    ("12345", "12,345 bytes is not it"),
    ("'small'", "must be a number of bytes, not str"),
], ids=["no-scales", "fp32-scales", "byte-a-weight", "4-bytes", "per-row", "per-tensor", "other", "text"])
def test_05_a_wrong_answer_fails_with_what_is_wrong(answer, says):
    source = with_answer(tagged(NB05, "exercise").source, "my_int4_bytes", answer)
    with pytest.raises(AssertionError, match=re.escape(says)) as failed:
        run(source, **names_05())
    assert "Hint: two 4-bit weights share a byte" in str(failed.value)
