"""Run vLLM as a machine of another CPU kind would run it (``WORKSHOP_CPU_ISA=avx2``).

vLLM's CPU build decides its kernels from what torch reports about the CPU: it loads ``_C_AVX2`` when
``torch.cpu._is_avx512_supported()`` is false, refuses an FP8 KV cache without AVX-512 or AMX, and takes
AMX code paths only when ``_is_amx_tile_supported()`` is true (vllm/platforms/cpu.py ``import_kernels``;
vllm/v1/attention/backends/cpu_attn.py). The local engine puts ``SITE_DIR`` on the server's
``PYTHONPATH`` when the kind is forced: its ``sitecustomize`` makes torch answer as that kind would in
every process vLLM starts (the engine core is a spawned process), and ``ATEN_CPU_CAPABILITY`` limits
torch's own kernels. An AVX-512 machine then serves with the AVX2 library and fails where an AVX2
machine fails. Without the variable nothing is patched.
"""

from __future__ import annotations

from pathlib import Path

from helpers.hardware.machine import FORCE_ISA_VARIABLE, force_flags

SITE_DIR = Path(__file__).resolve().parent / "forced_isa_site"  # package data: in the wheel too (pyproject.toml)
ATEN_CAPABILITY = {"avx2": "avx2", "avx512": "avx512", "amx": "avx512"}


def torch_cpu_answers(isa: str) -> dict[str, bool]:
    """What ``torch.cpu``'s capability questions answer on a CPU of kind ``isa``."""
    flags = force_flags(frozenset(), isa)
    return {"_is_avx512_supported": "avx512f" in flags, "_is_avx512_bf16_supported": "avx512_bf16" in flags,
            "_is_avx512_vnni_supported": "avx512f" in flags, "_is_amx_tile_supported": "amx_tile" in flags,
            "_is_amx_fp16_supported": False}


def force_torch_cpu_answers(isa: str) -> dict[str, bool]:
    """Make this process's ``torch.cpu`` answer as a CPU of kind ``isa``; returns the answers."""
    import torch

    answers = torch_cpu_answers(isa)
    for name, value in answers.items():
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda value=value: value)
    return answers


def engine_environment(isa: str | None, environ: dict[str, str]) -> dict[str, str]:
    """The variables a vLLM server process needs to run as kind ``isa`` (empty when not forced)."""
    if not isa:
        return {}
    python_path = [str(SITE_DIR), *filter(None, environ.get("PYTHONPATH", "").split(":"))]
    return {FORCE_ISA_VARIABLE: isa, "PYTHONPATH": ":".join(python_path),
            "ATEN_CPU_CAPABILITY": ATEN_CAPABILITY.get(isa.strip().lower().replace("-", ""), "avx2")}
