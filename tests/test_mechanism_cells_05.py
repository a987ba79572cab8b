"""Notebook 05's mechanism cell (tag ``mechanism``: one weight matrix quantized to FP8 E4M3 and INT8 by hand, in torch)
run on its own, from the notebook, against the helper that does the same arithmetic
(helpers/lessons/l05_quantize_by_hand.py): tiny-agent's own matrix, and an edge case (a row of zeros and one outlier);
the helper itself against what llmcompressor stored in the shipped FP8 and INT8 checkpoints."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch

import notebook_cells
from helpers.core.settings import models_dir
from helpers.lessons import l05_quantize_by_hand as q

NB05 = Path(__file__).resolve().parent.parent / "notebooks" / "05_quantization.ipynb"
LAYER = "model.layers.0.mlp.down_proj"


def tagged(tag: str) -> nbformat.NotebookNode:
    return notebook_cells.tagged(NB05, tag)


def run_cell(W: torch.Tensor) -> dict:
    namespace = {"W": W}
    exec(compile(tagged("mechanism").source, "<mechanism cell>", "exec"), namespace)  # noqa: S102 - the notebook's cell
    return namespace


def tiny_agent_matrix() -> torch.Tensor:
    return q.load_weight(models_dir() / "tiny-agent", f"{LAYER}.weight")


def zero_row_and_outlier() -> torch.Tensor:
    torch.manual_seed(0)
    W = torch.randn(8, 64) * 0.02
    W[3] = 0.0            # a row of zeros: its scale must not divide 0 by 0
    W[5, 7] = 4.0         # one outlier, 200 times the other weights
    return W


def test_the_cell_stands_alone_in_10_to_25_lines_without_the_helpers():
    source = tagged("mechanism").source
    lines = [line for line in source.splitlines() if line.strip()]
    assert 10 <= len(lines) <= 25 and "helpers" not in source and "import torch" in source


@pytest.mark.parametrize("make", [tiny_agent_matrix, zero_row_and_outlier], ids=["tiny-agent", "zero-row-and-outlier"])
def test_the_cell_quantizes_as_the_helper_does(make, capsys):
    W = make()
    cell = run_cell(W)
    fp8_back, _ = q.fp8_per_channel(W)
    int8_back, _ = q.int8_per_channel(W)
    assert torch.equal(cell["fp8_back"], fp8_back) and torch.equal(cell["int8_back"], int8_back)
    helper = q.quantization_errors(W)
    assert list(cell["quant_errors"]) == list(helper) == list(q.FORMATS)
    for name, (rel, worst) in cell["quant_errors"].items():
        assert rel == pytest.approx(helper[name][0], rel=1e-5) and worst == pytest.approx(helper[name][1], rel=1e-6)
    assert "fp8 e4m3, per channel: relative error" in capsys.readouterr().out


def test_the_edge_case_keeps_zeros_and_shows_what_the_outlier_costs():
    W = zero_row_and_outlier()
    cell = run_cell(W)
    for back in (cell["fp8_back"], cell["int8_back"]):
        assert torch.isfinite(back).all() and torch.equal(back[3], torch.zeros(64))
    # per row: the outlier's row loses its small weights in INT8 (its steps are 4/127 wide), FP8 keeps them relative
    small = [i for i in range(64) if i != 7]
    int8_row = q.quantization_error(W[5, small], cell["int8_back"][5, small])[0]
    fp8_row = q.quantization_error(W[5, small], cell["fp8_back"][5, small])[0]
    assert int8_row > 0.3 and fp8_row < 0.1
    other_rows = [i for i in range(8) if i not in (3, 5)]
    assert q.quantization_error(W[other_rows], cell["int8_back"][other_rows])[0] < 0.01  # the other rows do not pay


def test_an_all_zero_matrix_has_no_error():
    assert q.quantization_errors(torch.zeros(4, 16)) == {name: (0.0, 0.0) for name in q.FORMATS}
    rel, worst = run_cell(torch.zeros(4, 16))["quant_errors"]["int8, per channel"]
    assert (rel, worst) == (0.0, 0.0)


def _stored(model: str) -> tuple[torch.Tensor, torch.Tensor]:
    from safetensors import safe_open

    with safe_open(str(models_dir() / model / "model.safetensors"), "pt") as f:
        return f.get_tensor(f"{LAYER}.weight"), f.get_tensor(f"{LAYER}.weight_scale")


def test_the_helper_is_what_llmcompressor_stored_in_the_shipped_checkpoints():
    W = tiny_agent_matrix()
    fp8_weight, fp8_scale = _stored("tiny-agent-fp8-dynamic")  # FP8 E4M3 per channel, BF16 scales
    _, scale = q.fp8_per_channel(W)
    assert torch.equal(scale.bfloat16(), fp8_scale)
    mine = (W / scale).clamp(-q.FP8_E4M3_MAX, q.FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    assert (mine.float() == fp8_weight.float()).float().mean() > 0.95
    int8_weight, _ = _stored("tiny-agent-w8a8")  # symmetric INT8 per channel
    _, scale = q.int8_per_channel(W)
    steps = torch.round(W / scale)
    assert (steps == int8_weight.float()).float().mean() > 0.9 and (steps - int8_weight.float()).abs().max() <= 1
