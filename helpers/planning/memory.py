"""The memory plan of a model on a GPU (or vLLM's CPU backend): weights, vLLM's overhead and the KV cache
that is left, as vLLM sizes it at start-up; the plan as a table row, and why it does not fit.

The model's shape, weight bytes and KV bytes come from ``shape``, ``weights`` and ``kv``; vLLM's accounting
follows the source of vLLM 0.32.0, cited where it is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from helpers.core.conclusion import plural
from helpers.hardware.gpus import GPU, get_gpu
from helpers.planning.kv import (DEFAULT_MAX_NUM_BATCHED_TOKENS, GPU_BLOCK_SIZE, KVCacheBytes, VllmKVCache,
                                 cpu_kv_cache, kv_cache_bytes, vllm_kv_cache)
from helpers.planning.shape import GIB, ConfigError, ModelShape, ModelSource, count_params, model_shape
from helpers.planning.weights import infer_weight_dtype, safetensors_bytes, weight_bytes, weight_format

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py CacheConfig.gpu_memory_utilization (0.9 before)

# Rough defaults for what vLLM keeps outside the KV cache besides the weights. vLLM measures these at
# start-up (vllm/v1/worker/gpu_worker.py determine_available_memory: a profiling forward pass over
# max_num_batched_tokens, memory allocated outside torch, a CUDA-graph estimate) and logs
# "Available KV cache memory"; replace these with the figures your own start-up log prints.
NON_TORCH_BYTES = GIB // 2  # NCCL, cuBLAS workspaces, attention-backend buffers: typically 0.1-0.5 GiB
CUDA_GRAPH_BYTES = GIB // 2  # captured CUDA graphs: typically 0.2-1 GiB (0 with --enforce-eager)
DEFAULT_MAX_NUM_SEQS = 256  # the sampler's dummy batch in the profiling run (GPUs under 70 GiB)


@dataclass(frozen=True)
class Overhead:
    """Memory vLLM keeps outside weights and KV cache, in bytes (an estimate, see NON_TORCH_BYTES)."""

    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    source: str = "estimate_overhead"

    @property
    def total_bytes(self) -> int:
        """All overhead together."""
        return self.activation_bytes + self.non_torch_bytes + self.cuda_graph_bytes


def estimate_overhead(source: ModelSource | ModelShape, max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                      max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, enforce_eager: bool = False) -> Overhead:
    """Rough peak activations + non-torch + CUDA-graph memory of vLLM's start-up profiling, in bytes.

    Activations: per batched token the widest MLP (gate/up output plus the activated half: 3 widths)
    and ~6 hidden-size buffers in BF16, plus FP32 logits and one copy for the sampler's dummy batch.
    Llama-3.1-8B at 8192 tokens: ~1.3 GiB, near the ~1.2 GiB vLLM logs. Replace it with your log's figure.
    """
    s = model_shape(source)
    widest = s.intermediate_size if not all(s.moe_layers) else 0
    if s.num_experts:
        widest = max(widest, s.experts_per_token * s.moe_intermediate_size + s.shared_expert_intermediate_size)
    activations = max_num_batched_tokens * (3 * widest + 6 * s.hidden_size) * 2 + max_num_seqs * s.vocab_size * 4 * 2
    return Overhead(activations, NON_TORCH_BYTES, 0 if enforce_eager else CUDA_GRAPH_BYTES)


def vllm_gpu_scheduler_defaults(total_memory_bytes: int, gpu_name: str = "") -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's OpenAI server picks on a GPU of this size.

    vllm/engine/arg_utils.py: >= 160 GiB 16384 / 1024; >= 70 GiB except A100 8192 / 1024; else 2048 / 256.
    """
    if total_memory_bytes >= 160 * GIB:
        return 16384, 1024
    if total_memory_bytes >= 70 * GIB and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256


def gpu_kv_memory_bytes(total_memory_bytes: int, gpu_memory_utilization: float, weight_bytes: int,
                        overhead_bytes: int) -> int:
    """KV memory vLLM gets on a GPU: ceil(total * utilization) - weights - overhead (may be negative).

    vllm/v1/worker/utils.py ``request_memory``: ``ceil(total_memory * gpu_memory_utilization)`` of the
    TOTAL memory; vllm/v1/worker/gpu_worker.py ``determine_available_memory`` subtracts the rest.
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    return math.ceil(total_memory_bytes * gpu_memory_utilization) - weight_bytes - overhead_bytes


@dataclass(frozen=True)
class MemoryPlan:
    """Everything the planner says about one model, and about one GPU when one is given."""

    model: str
    total_params: int
    active_params: int
    weight_dtype: str
    weight_bytes: int
    weight_bytes_source: str
    kv_dtype: str
    kv: KVCacheBytes
    gpu: str | None = None  # "cpu" for vLLM's CPU backend
    total_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    overhead: Overhead | None = None
    kv_cache: VllmKVCache | None = None
    notes: tuple[str, ...] = ()  # assumptions made for a config that left something out (ModelShape.notes)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token of the full-attention layers."""
        return self.kv.bytes_per_token


def plan_memory(source: ModelSource, gpu: str | GPU | None = None, weight_dtype: str | None = None, kv_dtype: str = "bf16",
                gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION, max_model_len: int | None = None,
                block_size: int | None = None, overhead_bytes: int | None = None,
                total_memory_bytes: int | None = None, max_num_batched_tokens: int | None = None,
                async_scheduling: bool = True, cpu_kv_cache_space_gib: int | None = None) -> MemoryPlan:
    """Plan a model (directory, config.json or dict) on an optional GPU (name or gpus.GPU) or vLLM's CPU backend.

    Weights: exact safetensors bytes when the directory has them and no ``weight_dtype`` is given;
    otherwise an estimate for ``weight_dtype`` (default: what quantization_config declares, else bf16).
    GPU: ``overhead_bytes`` defaults to ``estimate_overhead``, ``total_memory_bytes`` to the total the
    driver reports (``gpus.GPU.usable_memory_bytes``, nvidia-smi's memory.total),
    ``max_num_batched_tokens`` to vLLM's default for that GPU; async scheduling (vLLM's GPU default)
    keeps two batches in flight, which sliding-window layers must hold. CPU backend: give
    ``cpu_kv_cache_space_gib`` (VLLM_CPU_KVCACHE_SPACE) and no GPU.
    """
    if gpu is not None and cpu_kv_cache_space_gib is not None:
        raise ValueError("give a GPU or a CPU KV cache space, not both")
    shape = model_shape(source)
    counts = count_params(shape)
    checkpoint = None
    if weight_dtype is None and not isinstance(source, Mapping):
        checkpoint = safetensors_bytes(Path(source) if Path(source).is_dir() else Path(source).parent)
    if checkpoint is not None:
        try:
            dtype = infer_weight_dtype(shape)
        except ConfigError:
            dtype = "checkpoint"
        w_bytes, w_source = checkpoint.total_bytes, checkpoint.source
    else:
        dtype = weight_dtype or infer_weight_dtype(shape)
        w_bytes = weight_bytes(counts, dtype)
        w_source = f"estimate from config.json ({weight_format(dtype).source})"
        if not shape.quantize_attention and dtype != "bf16":
            w_source += "; attention kept in BF16, as quantization_config.modules_to_not_convert says"
    kv = kv_cache_bytes(shape, kv_dtype)
    plan = MemoryPlan(shape.name, counts.total, counts.active, dtype, w_bytes, w_source, kv_dtype, kv,
                      notes=shape.notes)
    if gpu is None and cpu_kv_cache_space_gib is None:
        return plan
    if max_model_len is None:
        if shape.max_position_embeddings is None:
            raise ConfigError("config.json lacks 'max_position_embeddings': pass max_model_len")
        max_model_len = shape.max_position_embeddings
    if cpu_kv_cache_space_gib is not None:
        cache = cpu_kv_cache(kv, max_model_len, kv_cache_space_gib=cpu_kv_cache_space_gib, block_size=block_size)
        return replace(plan, gpu="cpu", kv_cache=cache)
    spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
    total = total_memory_bytes if total_memory_bytes is not None else spec.usable_memory_bytes
    batched_tokens, max_num_seqs = vllm_gpu_scheduler_defaults(total, spec.name)
    if max_num_batched_tokens is not None:
        batched_tokens = max_num_batched_tokens
    if overhead_bytes is None:
        overhead = estimate_overhead(shape, batched_tokens, max_num_seqs)
    else:
        overhead = Overhead(overhead_bytes, 0, 0, source="given (all in activation_bytes)")
    kv_memory = gpu_kv_memory_bytes(total, gpu_memory_utilization, w_bytes, overhead.total_bytes)
    in_flight = batched_tokens * (2 if async_scheduling else 1)  # vllm/config/vllm.py max_in_flight_tokens
    cache = vllm_kv_cache(kv, kv_memory, max_model_len, block_size or GPU_BLOCK_SIZE, in_flight)
    return replace(plan, gpu=spec.name, total_memory_bytes=total, gpu_memory_utilization=gpu_memory_utilization,
                   overhead=overhead, kv_cache=cache)


def plan_row(plan: MemoryPlan, conversation_tokens: int | None = None) -> dict[str, Any]:
    """One plan as a table row in GiB (2**30 bytes, the unit of nvidia-smi and vLLM's logs);
    ``conversation_tokens`` adds how many such conversations fit in the KV cache at once."""
    cache = plan.kv_cache
    row: dict[str, Any] = {"model": plan.model, "gpu": plan.gpu, "weights": plan.weight_dtype, "kv": plan.kv_dtype,
                           "weights_gib": plan.weight_bytes / GIB, "kv_bytes_per_token": plan.kv_bytes_per_token}
    if plan.total_memory_bytes is not None and plan.gpu_memory_utilization is not None:
        row["memory_gib"] = plan.total_memory_bytes / GIB
        row["budget_gib"] = plan.total_memory_bytes * plan.gpu_memory_utilization / GIB
    if plan.overhead is not None:
        row["overhead_gib"] = plan.overhead.total_bytes / GIB
    if cache is not None:
        row.update(kv_cache_gib=max(0, cache.kv_memory_bytes) / GIB, kv_cache_tokens=cache.kv_cache_tokens,
                   block_size=cache.block_size, max_model_len=cache.max_model_len,
                   max_concurrency_at_max_len=round(cache.max_concurrency, 2),
                   requests_at_max_len=math.floor(cache.max_concurrency) if cache.fits else 0, fits=cache.fits)
        if conversation_tokens:
            row[f"conversations_of_{conversation_tokens}_tokens"] = cache.kv_cache_tokens // conversation_tokens
    return row


def fit_problem(row: Mapping[str, Any]) -> str:
    """What keeps a ``plan_row`` from starting: "weights" (the weights alone exceed the budget), "overhead" (weights
    and vLLM's overhead leave no KV cache), "max_model_len" (one request of it does not fit the KV cache), or ''
    when it fits."""
    if row.get("fits", True):
        return ""
    if "budget_gib" in row:
        if row["weights_gib"] >= row["budget_gib"]:
            return "weights"
        if row["weights_gib"] + row.get("overhead_gib", 0.0) >= row["budget_gib"]:
            return "overhead"
    return "max_model_len"


def fit_verdict(row: Mapping[str, Any]) -> str:
    """Why a ``plan_row`` does not start, beginning "does not fit"; '' when it fits. The reason is the weights
    alone above the budget, the weights and vLLM's overhead that leave no KV cache, or a max_model_len above
    what the KV cache holds for one request (vLLM then refuses to start)."""
    problem = fit_problem(row)
    if not problem:
        return ""
    if problem in ("weights", "overhead"):
        budget = f"the {row['budget_gib']:.1f} GiB budget ({row['memory_gib']:.1f} GiB x utilization)" \
            if "memory_gib" in row else f"the {row['budget_gib']:.1f} GiB budget"
        if problem == "weights":
            return f"does not fit: the weights alone ({row['weights_gib']:.1f} GiB of weights) exceed {budget}"
        return (f"does not fit: {row['weights_gib']:.1f} GiB of weights + {row.get('overhead_gib', 0.0):.1f} GiB of "
                f"vLLM overhead fill {budget}, so no KV cache is left")
    return (f"does not fit: max_model_len {row['max_model_len']:,} tokens is above the KV cache's "
            f"{row['kv_cache_tokens']:,} tokens for one request, so vLLM refuses to start; lower --max-model-len "
            "or free memory")


def fit_title(row: Mapping[str, Any], conversation_tokens: int | None = None) -> str:
    """The explorer's title: model, GPU and the memory its driver reports, then "does not fit" and why
    (``fit_verdict``), or how many requests of max_model_len tokens fit at once (and of
    ``conversation_tokens``, when given)."""
    memory_gib = f" ({row['memory_gib']:.2f} GiB as nvidia-smi reports)" if "memory_gib" in row else ""
    head = f"{row['model']} on {row['gpu']}{memory_gib}"
    reason = fit_verdict(row)
    if reason:
        return f"{head}: {reason}"
    at_max_len = (f"{plural(int(row['requests_at_max_len']), 'conversation')} of max_model_len "
                  f"{row['max_model_len']:,} tokens at once")
    key = f"conversations_of_{conversation_tokens}_tokens"
    if conversation_tokens and key in row and conversation_tokens != row["max_model_len"]:
        at_max_len += f" ({int(row[key]):,} of {conversation_tokens:,} tokens)"
    return f"{head}: fits {at_max_len}"
