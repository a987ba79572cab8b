"""``workshop memory`` and ``workshop gpus``: the memory planner and the GPU table on the command line.

``register(subparsers)`` adds both subcommands to an argparse parser; each sets ``func`` to a handler
that takes the parsed arguments and returns an exit code (2 for a missing config or unknown GPU).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from helpers.hardware import gpus
from helpers.planning import memory
from helpers.planning.kv import CPU_BLOCK_SIZE, GPU_BLOCK_SIZE
from helpers.planning.weights import WEIGHT_FORMATS
from helpers.cli.args import error, number_type

KV_DTYPES = ("bf16", "fp8")
# Why a plan has no KV cache at all, and what lets a plan start, by what stops it (memory.fit_problem).
NO_KV_CACHE = {"weights": "the weights alone exceed the budget",
               "overhead": "the weights and vLLM's overhead fill the budget"}
WHAT_TO_DO = {
    "weights": "use a smaller weight format (--weight-dtype), a GPU with more memory, or several GPUs (vLLM's "
               "--tensor-parallel-size splits the weights)",
    "overhead": "use a smaller weight format (--weight-dtype) or raise --gpu-memory-utilization",
    "max_model_len": "lower --max-model-len or the weights (--weight-dtype), or raise --gpu-memory-utilization",
}


def what_to_do(row: dict[str, Any]) -> str:
    """What lets a plan that does not fit start (a ``plan_row``); '' when it fits."""
    problem = memory.fit_problem(row)
    if not problem:
        return ""
    advice = WHAT_TO_DO[problem]
    if problem == "weights" and row.get("memory_gib", 0) > row["weights_gib"]:  # below the card, above the budget
        advice = "raise --gpu-memory-utilization, " + advice
    return "vLLM will refuse to start: " + advice


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add the ``memory`` and ``gpus`` subcommands to ``subparsers``."""
    p = subparsers.add_parser(
        "memory", help="parameters, weight bytes, KV cache per token and vLLM's KV budget from config.json",
        description="Plan a model's memory from its config.json; with --gpu, predict vLLM's KV cache capacity.")
    p.add_argument("config", metavar="CONFIG", help="model directory holding config.json, or a config.json path")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--gpu", help="GPU name from `workshop gpus` (case-insensitive), e.g. H100-SXM")
    target.add_argument("--cpu-kv-cache-space-gib", type=number_type(int, 1), metavar="GIB",
                        help="vLLM's CPU backend: the VLLM_CPU_KVCACHE_SPACE you start it with (block size 128)")
    p.add_argument("--weight-dtype", choices=list(WEIGHT_FORMATS),
                   help="weight format (default: exact safetensors bytes if present, else quantization_config, else bf16)")
    p.add_argument("--kv-dtype", choices=KV_DTYPES, default="bf16", help="KV-cache dtype (default bf16)")
    p.add_argument("--gpu-memory-utilization", type=number_type(float, 0, 1, above=True),
                   default=memory.DEFAULT_GPU_MEMORY_UTILIZATION,
                   help=f"share of TOTAL GPU memory vLLM may use (default {memory.DEFAULT_GPU_MEMORY_UTILIZATION})")
    p.add_argument("--max-model-len", type=number_type(int, 1), help="tokens per request (default: max_position_embeddings)")
    p.add_argument("--block-size", type=number_type(int, 1),
                   help=f"KV block size in tokens (default: vLLM's, {GPU_BLOCK_SIZE} on GPU, "
                        f"{CPU_BLOCK_SIZE} on CPU)")
    p.add_argument("--overhead-bytes", type=number_type(int, 0),
                   help="activations + non-torch + CUDA graphs in bytes, e.g. 2e9 (default: memory.estimate_overhead)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run_memory)

    g = subparsers.add_parser("gpus", help="the GPU table (memory, bandwidth, dense TFLOP/s) with sources",
                              description="List the GPUs the planner knows, with the source of every figure.")
    g.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    g.set_defaults(func=run_gpus)



def _gb(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:,.2f} GB"


def memory_fields(plan: memory.MemoryPlan) -> dict[str, Any]:
    """The JSON fields of ``workshop memory`` for a plan."""
    kv = plan.kv
    out: dict[str, Any] = {
        "model": plan.model,
        "total_params": plan.total_params,
        "active_params": plan.active_params,
        "weight_dtype": plan.weight_dtype,
        "weight_bytes": plan.weight_bytes,
        "weight_bytes_source": plan.weight_bytes_source,
        "kv_dtype": plan.kv_dtype,
        "kv_bytes_per_token": kv.bytes_per_token,
        "num_full_attention_layers": kv.num_full_layers,
        "num_sliding_window_layers": kv.num_sliding_layers,
        "sliding_window": kv.sliding_window,
        "sliding_kv_bytes_per_token": kv.sliding_bytes_per_token,
        "num_linear_attention_layers": kv.num_linear_layers,
        "linear_state_bytes_per_seq": kv.linear_state_bytes_per_seq,
        "notes": list(plan.notes),
    }
    if plan.kv_cache is not None:
        c = plan.kv_cache
        out["gpu"] = plan.gpu
        if plan.overhead is not None:
            out.update({
                "total_memory_bytes": plan.total_memory_bytes,
                "gpu_memory_utilization": plan.gpu_memory_utilization,
                "overhead_bytes": plan.overhead.total_bytes,
            })
        verdict = memory.fit_verdict(memory.plan_row(plan))
        out.update({
            "kv_cache_bytes": max(0, c.kv_memory_bytes),  # none left: 0, and the verdict says why
            "block_size": c.block_size,
            "num_blocks": c.num_blocks,
            "kv_cache_tokens": c.kv_cache_tokens,
            "vllm_kv_cache_size_tokens": c.vllm_kv_cache_size_tokens,
            "max_model_len": c.max_model_len,
            "max_concurrency": c.max_concurrency,
            "fits": c.fits,
            "exact": c.exact,
        })
        if verdict:
            out["verdict"] = verdict
    return out


def _memory_table(plan: memory.MemoryPlan) -> str:
    kv = plan.kv
    rows = [
        ("model", plan.model),
        ("parameters", f"{plan.total_params:,} total, {plan.active_params:,} active per token"),
        (f"weights ({plan.weight_dtype})", f"{_gb(plan.weight_bytes)}  [{plan.weight_bytes_source}]"),
        (f"KV cache ({plan.kv_dtype})", f"{kv.bytes_per_token:,} B/token over {kv.num_full_layers} full-attention layers"),
    ]
    if kv.num_sliding_layers:
        rows.append(("sliding-window layers", f"{kv.num_sliding_layers} x window {kv.sliding_window}: "
                                              f"{kv.sliding_bytes_per_token:,} B/token, bounded per sequence"))
    if kv.num_linear_layers:
        rows.append(("linear-attention layers", f"{kv.num_linear_layers}: {kv.linear_state_bytes_per_seq:,} B per sequence"))
    if plan.kv_cache is not None:
        c = plan.kv_cache
        if plan.overhead is not None:
            rows += [
                ("GPU", f"{plan.gpu}: {_gb(plan.total_memory_bytes or 0)} x {plan.gpu_memory_utilization}"),
                ("overhead", f"{_gb(plan.overhead.total_bytes)} (activations + non-torch + CUDA graphs, estimated)"),
            ]
        row = memory.plan_row(plan)
        verdict = memory.fit_verdict(row)
        kv_memory = _gb(c.kv_memory_bytes) + (" (CPU backend)" if plan.gpu == "cpu" else "")
        if c.kv_memory_bytes <= 0:  # the weights (and the overhead) took the whole budget: no KV cache at all
            kv_memory = "none (0 GB): " + NO_KV_CACHE.get(memory.fit_problem(row), verdict)
        rows += [
            ("KV cache memory", kv_memory),
            ("KV blocks", f"{c.num_blocks:,} of {c.block_size} tokens = {c.kv_cache_tokens:,} tokens"),
            (f"max concurrency at {c.max_model_len:,} tokens", f"{c.max_concurrency:.2f}"
                                                              + ("" if c.exact else " (approximate: hybrid model)")),
        ]
        if not c.fits:
            rows += [("WARNING", verdict), ("what to do", what_to_do(row))]
    rows += [("note", note) for note in plan.notes]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run_memory(args: argparse.Namespace) -> int:
    """Handler of ``workshop memory``: print the plan; 2 on a missing config or unknown GPU."""
    try:
        plan = memory.plan_memory(args.config, gpu=args.gpu, weight_dtype=args.weight_dtype, kv_dtype=args.kv_dtype,
                                  gpu_memory_utilization=args.gpu_memory_utilization,
                                  max_model_len=args.max_model_len, block_size=args.block_size,
                                  overhead_bytes=args.overhead_bytes,
                                  cpu_kv_cache_space_gib=args.cpu_kv_cache_space_gib)
    except (ValueError, LookupError) as exc:  # ConfigError, UnknownGPUError, out-of-range settings
        return error(str(exc))
    if args.json:
        print(json.dumps(memory_fields(plan), indent=1))
    else:
        print(_memory_table(plan))
    return 0


def run_gpus(args: argparse.Namespace) -> int:
    """Handler of ``workshop gpus``: print the GPU table with the source of every figure."""
    if args.json:
        print(json.dumps([asdict(g) for g in gpus.GPUS], indent=1))
        return 0
    print(f"{'GPU':<14} {'memory':>8} {'usable':>10} {'GB/s':>6} {'BF16 TF':>8} {'FP8 TF':>7}  (dense)")
    for g in gpus.GPUS:
        fp8 = f"{g.fp8_tflops:g}" if g.fp8_tflops is not None else "-"
        print(f"{g.name:<14} {g.memory_bytes / 1e9:>6.0f}GB {g.usable_memory_gib:>7.2f}GiB {g.bandwidth_gb_s:>6g} "
              f"{g.bf16_tflops:>8g} {fp8:>7}"
              + (f"  {g.note}" if g.note else ""))
        for source in dict.fromkeys((g.memory_source, g.usable_memory_source, g.bandwidth_source, g.bf16_source,
                                     g.fp8_source)):
            print(f"{'':<14}   source: {source}")
    return 0
