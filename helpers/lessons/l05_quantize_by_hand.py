"""Notebook 05's mechanism and code exercise: one weight matrix quantized by hand, and its bytes in INT4.

The notebook's ``mechanism`` cell writes the quantizers out in torch; these functions are the same arithmetic, which
tests/test_mechanism_cells_05.py holds the cell to:
- ``fp8_per_channel``: FP8 E4M3 with one scale per output channel (a row): the row's largest |w| maps to E4M3's
  largest finite value, 448, and each weight is rounded to the nearest E4M3 number (what llmcompressor's FP8_DYNAMIC
  stores for the weights of ``tiny-agent-fp8-dynamic``);
- ``int8_per_channel``: symmetric INT8, one scale per row: the row's largest |w| maps to 127 (``tiny-agent-w8a8``);
- ``quantization_errors``: each format's relative error (Frobenius norm of the error over the matrix's) and its
  largest absolute error.
A row of zeros keeps a zero scale's place (the scale is floored at ``SCALE_FLOOR``) and comes back as zeros.

``int4_bytes_check`` checks the attendee's bytes of the matrix in INT4 with one BF16 scale per ``group`` weights of a
row (W4A16's layout), and ``checkpoint_tensor_bytes`` reads what a shipped checkpoint stores for one layer.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FP8_E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
INT8_MAX = 127
SCALE_FLOOR = 1e-12  # a row of zeros: a scale this small, so 0 / scale stays 0 (never 0 / 0)
FORMATS = ("fp8 e4m3, per channel", "int8, per channel")
_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8,
                "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1}


def load_weight(model_dir: Path | str, name: str) -> "torch.Tensor":
    """One weight matrix of a shipped checkpoint (``model.safetensors``), as float32."""
    from safetensors import safe_open

    path = Path(model_dir) / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        if name not in f.keys():
            linear = sorted(k for k in f.keys() if k.endswith("_proj.weight"))
            raise KeyError(f"{path} has no tensor {name!r}; its linear layers are e.g. {', '.join(linear[:4])}")
        return f.get_tensor(name).float()


def _row_scale(w: "torch.Tensor", top: float) -> "torch.Tensor":
    return w.abs().amax(dim=1, keepdim=True).clamp(min=SCALE_FLOOR) / top


def fp8_per_channel(w: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """(the weights as FP8 E4M3 gives them back, the per-row scales): w / scale rounded to E4M3, times the scale."""
    import torch

    w = w.float()
    scale = _row_scale(w, FP8_E4M3_MAX)
    stored = (w / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return stored.float() * scale, scale


def int8_per_channel(w: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """(the weights as symmetric INT8 gives them back, the per-row scales): round(w / scale) in [-127, 127] x scale."""
    import torch

    w = w.float()
    scale = _row_scale(w, INT8_MAX)
    stored = torch.round(w / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return stored.float() * scale, scale


def quantization_error(w: "torch.Tensor", back: "torch.Tensor") -> tuple[float, float]:
    """(relative error: ||back - w|| / ||w||, Frobenius; 0 for an all-zero w; the largest |back - w|)."""
    w = w.float()
    norm = w.norm().item()
    diff = back - w
    return (diff.norm().item() / norm if norm else 0.0), diff.abs().max().item()


def quantization_errors(w: "torch.Tensor") -> dict[str, tuple[float, float]]:
    """Per format of ``FORMATS``: (relative error, max absolute error) of ``w`` quantized and read back."""
    return {FORMATS[0]: quantization_error(w, fp8_per_channel(w)[0]),
            FORMATS[1]: quantization_error(w, int8_per_channel(w)[0])}


# ---------------------------------------------------------------- write it yourself: the bytes of W in INT4

INT4_HINT = ("two 4-bit weights share a byte; each row of `cols` weights has cols / GROUP_SIZE groups, and each group "
             "one BF16 scale of 2 bytes")


def int4_bytes(rows: int, cols: int, group: int, scale_bytes: int = 2) -> int:
    """Bytes of a rows x cols matrix in INT4 with one scale (``scale_bytes``) per ``group`` weights of a row."""
    if cols % group:
        raise ValueError(f"{cols} columns do not split into groups of {group}")
    return rows * cols // 2 + rows * (cols // group) * scale_bytes


def int4_bytes_check(rows: int, cols: int, group: int) -> Callable[[Any], str | None]:
    """The check of an attendee's bytes of a rows x cols matrix in INT4 with a BF16 scale per ``group`` weights of a
    row: None when right, else the sentence naming the likely slip (no scales, FP32 scales, a byte per weight, one
    scale per row or per tensor)."""
    right = int4_bytes(rows, cols, group)
    packed = rows * cols // 2
    slips = [
        (packed, f"that is the packed weights alone: add the scales, one BF16 (2 bytes) per group of {group}."),
        (int4_bytes(rows, cols, group, 4), "those scales are FP32 (4 bytes); W4A16 stores them in BF16, 2 bytes."),
        (rows * cols + rows * (cols // group) * 2, "4 bits is half a byte: two weights share a byte."),
        (rows * cols * 4 + rows * (cols // group) * 2, "4 bits is half a byte, not 4 bytes."),
        (packed + rows * 2, f"that is one scale per row: a row of {cols} has {cols // group} groups of {group}."),
        (packed + 2, "that is one scale for the whole matrix: each group of a row has its own."),
    ]

    def check(answer: Any) -> str | None:
        if isinstance(answer, bool) or not isinstance(answer, (int, float)):
            return f"my_int4_bytes must be a number of bytes, not {type(answer).__name__}."
        if answer == right:
            return None
        for value, why in slips:
            if value != right and answer == value:
                return why
        return f"{answer:,} bytes is not it: the packed weights (half a byte each) plus the scales."

    return check


def checkpoint_tensor_bytes(model_dir: Path | str, prefix: str) -> dict[str, int]:
    """The bytes a shipped checkpoint stores under ``prefix`` (a layer, e.g. ``model.layers.0.mlp.down_proj``), per
    tensor, read from its safetensors header."""
    path = Path(model_dir) / "model.safetensors"
    with path.open("rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    out = {}
    for name, entry in header.items():
        if name != "__metadata__" and name.startswith(prefix + "."):
            start, end = entry["data_offsets"]
            out[name[len(prefix) + 1:]] = end - start
    if not out:
        raise KeyError(f"{path} stores nothing under {prefix!r}")
    return out
