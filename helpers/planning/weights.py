"""Weight bytes: the weight formats and their bits per weight, a checkpoint's bytes estimated from its
config.json or read exactly from its safetensors headers, and the format a ``quantization_config`` declares.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from helpers.planning.shape import ConfigError, ModelShape, ModelSource, ParamCounts, count_params, model_shape


@dataclass(frozen=True)
class WeightFormat:
    """Bits per weight of a format for the linear layers of the decoder blocks, with its source."""

    name: str
    bits_per_weight: Fraction
    source: str


# Embeddings, LM head, norms, routers and biases stay BF16 in real checkpoints of every format.
WEIGHT_FORMATS: dict[str, WeightFormat] = {
    "bf16": WeightFormat("bf16", Fraction(16), "2 bytes per weight"),
    "fp8": WeightFormat("fp8", Fraction(8) + Fraction(32, 128 * 128),
                        "FP8 E4M3 with one FP32 scale per 128x128 block (DeepSeek-V3, Qwen3-FP8): ~8.002"),
    "int8": WeightFormat("int8", Fraction(8), "INT8 with per-channel scales (scales negligible): ~8"),
    "int4": WeightFormat("int4", Fraction(4) + Fraction(16 + 4, 128),
                         "GPTQ/AWQ int4, group 128: FP16 scale + 4-bit zero point per 128 weights: ~4.16"),
    "nvfp4": WeightFormat("nvfp4", Fraction(4) + Fraction(8, 16),
                          "NVFP4: FP8 E4M3 scale per 16 weights (+ one FP32 global scale): 4.5"),
    "mxfp4": WeightFormat("mxfp4", Fraction(4) + Fraction(8, 32),
                          "MXFP4 (OCP MX): E8M0 scale per 32 weights: 4.25"),
}


def weight_format(weight_dtype: str) -> WeightFormat:
    """The WeightFormat named ``weight_dtype`` (bf16, fp8, int8, int4, nvfp4, mxfp4)."""
    try:
        return WEIGHT_FORMATS[weight_dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown weight dtype {weight_dtype!r}: use one of {', '.join(WEIGHT_FORMATS)}") from None


def linear_weight_bytes(num_params: int, weight_dtype: str) -> int:
    """Bytes of ``num_params`` linear-layer weights stored in ``weight_dtype``, scales included."""
    return math.ceil(num_params * weight_format(weight_dtype).bits_per_weight / 8)


def weight_bytes(source: ModelSource | ModelShape | ParamCounts, weight_dtype: str = "bf16") -> int:
    """Estimated checkpoint bytes: linear layers in ``weight_dtype``, embeddings/LM head/norms/biases in BF16, and
    attention too when the checkpoint's quantization_config keeps it unconverted (gpt-oss: experts alone MXFP4)."""
    counts = source if isinstance(source, ParamCounts) else count_params(source)
    return linear_weight_bytes(counts.quantizable_total, weight_dtype) + 2 * (counts.total - counts.quantizable_total)


def active_weight_bytes(source: ModelSource | ModelShape | ParamCounts, weight_dtype: str = "bf16") -> int:
    """Bytes of the parameters one token touches (all of them for a dense model)."""
    counts = source if isinstance(source, ParamCounts) else count_params(source)
    quantized = counts.quantizable_active
    return linear_weight_bytes(quantized, weight_dtype) + 2 * (counts.active - quantized)


def infer_weight_dtype(source: ModelSource | ModelShape) -> str:
    """The weight format a checkpoint declares in its ``quantization_config`` ("bf16" when none)."""
    q = model_shape(source).quantization_config
    if not q:
        return "bf16"
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8"
    if method == "mxfp4":
        return "mxfp4"
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin") and int(q.get("bits", 4)) in (4, 8):
        return "int4" if int(q.get("bits", 4)) == 4 else "int8"
    if method == "modelopt" and str(q.get("quant_algo", "")).upper() in ("NVFP4", "FP8"):
        return str(q["quant_algo"]).lower()
    if method == "compressed-tensors":
        for group in (q.get("config_groups") or {}).values():
            weights = group.get("weights") or {}
            bits, kind = weights.get("num_bits"), weights.get("type")
            if bits == 8:
                return "fp8" if kind == "float" else "int8"
            if bits == 4:
                return "nvfp4" if kind == "float" else "int4"
    raise ConfigError(f"cannot tell the weight format of quantization_config {dict(q)}: "
                      f"pass a weight dtype ({', '.join(WEIGHT_FORMATS)})")


@dataclass(frozen=True)
class CheckpointBytes:
    """Exact tensor bytes of a safetensors checkpoint, read from the file headers only."""

    total_bytes: int
    bytes_by_dtype: dict[str, int]
    num_tensors: int
    files: tuple[str, ...]
    source: str  # "safetensors headers" or "model.safetensors.index.json metadata.total_size"


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of a safetensors file: {tensor name: {dtype, shape, data_offsets}} (no tensor is read)."""
    path = Path(path)
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ConfigError(f"{path} is too short for a safetensors file: download it again")
        (header_len,) = struct.unpack("<Q", raw)  # 8-byte little-endian header length
        if header_len > path.stat().st_size - 8:
            raise ConfigError(f"{path} has a header longer than the file: it is truncated or not safetensors")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path} has an unreadable safetensors header ({exc})") from exc
    return header


def safetensors_bytes(source: str | os.PathLike[str]) -> CheckpointBytes | None:
    """Exact tensor bytes of the *.safetensors in a directory (or one file); None when there are none.

    With only ``model.safetensors.index.json`` present (no shards), its ``metadata.total_size`` is used.
    """
    path = Path(source)
    if path.is_file() and path.suffix == ".safetensors":
        files = [path]
    elif path.is_dir():
        files = sorted(path.glob("*.safetensors"))
    else:
        return None
    if not files:
        index = path / "model.safetensors.index.json" if path.is_dir() else None
        if index is not None and index.is_file():
            meta = json.loads(index.read_text()).get("metadata") or {}
            if "total_size" in meta:
                return CheckpointBytes(int(meta["total_size"]), {}, 0, (index.name,),
                                       "model.safetensors.index.json metadata.total_size")
        return None
    by_dtype: dict[str, int] = {}
    count = 0
    for file in files:
        for name, info in read_safetensors_header(file).items():
            if name == "__metadata__":
                continue
            try:
                start, end = info["data_offsets"]
                by_dtype[info["dtype"]] = by_dtype.get(info["dtype"], 0) + (end - start)
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"{file}: tensor {name!r} has a malformed header entry ({exc!r})") from exc
            count += 1
    return CheckpointBytes(sum(by_dtype.values()), by_dtype, count, tuple(f.name for f in files), "safetensors headers")
