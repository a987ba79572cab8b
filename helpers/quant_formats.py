"""Which hardware computes natively in each weight format of ``helpers.memory.WEIGHT_FORMATS``.

Elsewhere a format can still be served, but its weights are widened to 16 bits inside the kernel:
it saves memory and bytes read per step, not arithmetic. One row per format: (hardware, source).
"""

from __future__ import annotations

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
