"""vllm-project/vllm#55006 on the local engine, when switched on (``WORKSHOP_FIX_SPEC_SAMPLING=1`` in the engine's
environment; off by default, and only notebook 06 and the reproduction in benchmarks/ turn it on).

What is wrong (vllm-project/vllm#55005, vLLM 0.32's CPU build): without Triton's CPU backend the rejection sampler's
Triton kernels are swapped for C++ fallbacks (``vllm/platforms/cpu.py``, ``register_triton_kernel_overrides``). The
fallback for ``expand_kernel``, ``_expand_kernel_impl`` in ``vllm/utils/cpu_triton_utils.py``, hands the C++ op
``_ensure_int64(output)``: for the float32 output of ``expand_batch_to_tokens`` (``vllm/v1/sample/
rejection_sampler.py``, allocated with ``x.new_empty``) that is a new int64 copy, which the op fills and nothing
copies back. ``apply_sampling_constraints`` then divides the target's logits at every verified position by
uninitialised memory (top-k and top-p are expanded the same way), at any temperature > 0, for any speculative method.

The change, #55006's diff to ``_expand_kernel_impl`` as its description states it ("Expand natively at the caller's
dtype in the shim: ``torch.repeat_interleave`` over ``diff(cu_num_tokens)`` with the ``replace_from -> replace_to``
rewrite applied at input dtype before the store"; the stored copy of the pull request holds its description, not its
patch lines, so ``expand_at_caller_dtype`` below is written from it)::

    -    torch.ops._C.expand_kernel_impl(_ensure_int64(output), _ensure_int64(input_val),
    -                                    _ensure_int64(cu_num_tokens), replace_from, replace_to)
    +    counts = diff(cu_num_tokens, prepend 0)                      # tokens per request
    +    values = input_val, with replace_from rewritten to replace_to  # at input_val's dtype
    +    output[:sum(counts)] = repeat_interleave(values, counts)      # stored at output's dtype

Nothing else in vLLM is touched: the patch replaces that one function, in the module it lives in, when that module is
first imported, so ``register_triton_kernel_overrides`` registers the fixed fallback. ``SITE_DIR``'s
``sitecustomize`` installs it in every process of the server (the engine core may be a spawned process), the way
``helpers.hardware.forced_isa`` forces a CPU kind. On a GPU build, or where Triton-CPU is installed
(vllm-project/vllm#44991 skips the fallbacks then), the fallback never runs and the switch changes nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

FIX_VARIABLE = "WORKSHOP_FIX_SPEC_SAMPLING"  # "1" in the engine's environment: apply vllm-project/vllm#55006
FIX_ENV = ((FIX_VARIABLE, "1"),)  # an EngineConfig's env with the fix switched on
PATCHED_MODULE = "vllm.utils.cpu_triton_utils"
SITE_DIR = Path(__file__).resolve().parent / "spec_sampling_fix_site"  # a package: the wheel holds it too


def expand_at_caller_dtype(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
                           MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803 (the Triton kernel's argument name)
    """``expand_kernel``'s CPU fallback as vllm-project/vllm#55006 writes it: each request's value, with
    ``replace_from`` rewritten to ``replace_to``, repeated over its tokens into ``output`` at ``output``'s dtype."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[:expanded.numel()].copy_(expanded)


def patch(module: Any) -> None:
    """Put ``expand_at_caller_dtype`` in place of ``module._expand_kernel_impl`` (``module``: vLLM's cpu_triton_utils)."""
    if not hasattr(module, "_expand_kernel_impl"):
        raise RuntimeError(f"{module.__name__} has no _expand_kernel_impl: this vLLM is not the one vllm#55006 fixes; "
                           f"unset {FIX_VARIABLE}.")
    module._expand_kernel_impl = expand_at_caller_dtype


class _PatchingLoader(importlib.abc.Loader):
    """Loads a module as its own loader would, then patches it."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        patch(module)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``PATCHED_MODULE`` the usual way and hands it a loader that patches it once it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != PATCHED_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install_on_import() -> None:
    """Patch ``PATCHED_MODULE`` in this process: now if it is imported already, else when it is."""
    if PATCHED_MODULE in sys.modules:
        patch(sys.modules[PATCHED_MODULE])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def run_next_sitecustomize(site_dir: str) -> None:
    """Run the ``sitecustomize`` that the path holds after ``site_dir`` (e.g. the forced CPU kind's), if any."""
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == site_dir:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = module
            spec.loader.exec_module(module)
            return


def engine_environment(environ: dict[str, str]) -> dict[str, str]:
    """The variables a vLLM server process needs for the fix when ``environ`` switches it on (else none)."""
    if environ.get(FIX_VARIABLE) != "1":
        return {}
    python_path = [str(SITE_DIR), *filter(None, environ.get("PYTHONPATH", "").split(":"))]
    return {"PYTHONPATH": ":".join(python_path)}
