"""Loaded by every Python process of a vLLM server started with a forced CPU kind (helpers/hardware/forced_isa.py)."""

import os

if os.environ.get("WORKSHOP_CPU_ISA"):
    from helpers.hardware.forced_isa import force_torch_cpu_answers

    force_torch_cpu_answers(os.environ["WORKSHOP_CPU_ISA"])
