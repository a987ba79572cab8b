"""Memory planner (planning.shape, weights, kv, memory): published parameter counts, KV bytes, weight bytes,
safetensors headers, vLLM's KV sizing; and notebook 02's conclusions and engine check (lessons.l02_memory)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from helpers.planning.kv import cpu_kv_cache, kv_cache_bytes, vllm_kv_cache
from helpers.planning.memory import (CUDA_GRAPH_BYTES, NON_TORCH_BYTES, estimate_overhead, fit_problem, fit_title,
                                     fit_verdict, gpu_kv_memory_bytes, plan_memory, plan_row,
                                     vllm_gpu_scheduler_defaults)
from helpers.planning.shape import REFERENCE_CONFIGS, ConfigError, count_params, load_config, model_shape
from helpers.planning.weights import (active_weight_bytes, infer_weight_dtype, read_safetensors_header,
                                      safetensors_bytes, weight_bytes)

CONFIGS = REFERENCE_CONFIGS

# Published parameter counts (model cards / safetensors totals, model-math.md) and KV bytes per token in BF16.
PUBLISHED = {
    "Qwen3-0.6B": (596_049_920, 596_049_920, 114_688),
    "Qwen3-4B": (4_022_468_096, 4_022_468_096, 147_456),
    "Qwen3-30B-A3B": (30_532_122_624, 3_353_032_704, 98_304),
    "Llama-3.1-8B": (8_030_261_248, 8_030_261_248, 131_072),
    "Llama-3.3-70B": (70_553_706_496, 70_553_706_496, 327_680),
}

MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1 config.json (the fields the planner reads)
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 32768, "sliding_window": None,
}

TINY_QWEN3 = {  # the workshop's tiny model (helpers.tiny.build.ModelShape), as in cpu-lab.md
    "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1536 + 2000,
    "tie_word_embeddings": True, "max_position_embeddings": 4096,
}


def _config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts_and_kv_bytes(name: str) -> None:
    total, active, kv_per_token = PUBLISHED[name]
    counts = count_params(CONFIGS / f"{name}.json")
    assert counts.total == total
    assert counts.active == active
    assert kv_cache_bytes(CONFIGS / f"{name}.json").bytes_per_token == kv_per_token


def test_deepseek_v3_mla_moe_counts_and_kv() -> None:
    counts = count_params(CONFIGS / "DeepSeek-V3.json")
    # 671B main model (the 14B multi-token-prediction layer is not counted, as vLLM loads it only for MTP).
    assert counts.total == 671_026_419_200
    # Active: 58 MoE layers touch 8 of 256 routed experts of 3*7168*2048 params each.
    assert counts.total - counts.active == 58 * (256 - 8) * 3 * 7168 * 2048
    assert (counts.num_moe_layers, counts.num_experts, counts.experts_per_token) == (58, 256, 8)
    kv = kv_cache_bytes(CONFIGS / "DeepSeek-V3.json")
    assert kv.bytes_per_token == 61 * (512 + 64) * 2 == 70_272  # MLA: no factor 2 for K and V
    assert kv.mla and kv.is_uniform
    assert kv_cache_bytes(CONFIGS / "DeepSeek-V3.json", "fp8").bytes_per_token == 35_136
    assert infer_weight_dtype(CONFIGS / "DeepSeek-V3.json") == "fp8"


def test_mixtral_num_local_experts() -> None:
    counts = count_params(MIXTRAL_8X7B)
    assert counts.total == 46_702_792_704
    assert counts.active == 12_879_925_248


def test_head_dim_comes_from_config_when_present() -> None:
    shape = model_shape(CONFIGS / "Qwen3-4B.json")
    assert shape.head_dim == 128  # not 2560 // 32 = 80
    no_head_dim = {k: v for k, v in _config("Llama-3.1-8B").items() if k != "head_dim"}
    assert model_shape(no_head_dim).head_dim == 4096 // 32


def test_directory_file_and_dict_agree(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((CONFIGS / "Qwen3-0.6B.json").read_text())
    from_dir = count_params(tmp_path)
    assert from_dir == count_params(tmp_path / "config.json") == count_params(_config("Qwen3-0.6B"))
    assert model_shape(tmp_path).name == tmp_path.name


def test_text_config_is_planned_for_vision_language_configs() -> None:
    nested = {"model_type": "qwen3_vl", "vision_config": {"hidden_size": 1152, "depth": 27},
              "tie_word_embeddings": True, "text_config": _config("Qwen3-0.6B")}
    assert count_params(nested).total == 596_049_920


def test_moe_layer_placement_spellings() -> None:
    base = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 6,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    all_moe = count_params(base)
    sparse_step = count_params({**base, "decoder_sparse_step": 2})  # layers 1, 3, 5 are MoE
    mlp_only = count_params({**base, "mlp_only_layers": [0, 4]})
    assert (all_moe.num_moe_layers, sparse_step.num_moe_layers, mlp_only.num_moe_layers) == (6, 3, 4)
    moe_mlp = 8 * 3 * 64 * 32 + 64 * 8  # experts + router
    dense_mlp = 3 * 64 * 256
    assert sparse_step.total - all_moe.total == 3 * (dense_mlp - moe_mlp)
    first_dense = count_params({**base, "first_k_dense_replace": 2, "n_shared_experts": 1})
    assert first_dense.num_moe_layers == 4
    assert first_dense.total - all_moe.total == 2 * (dense_mlp - moe_mlp) + 4 * 3 * 64 * 32
    qwen_shared = count_params({**base, "shared_expert_intermediate_size": 48})
    assert qwen_shared.total - all_moe.total == 6 * (3 * 64 * 48 + 64)  # shared expert + its sigmoid gate


def test_mla_without_q_lora() -> None:
    cfg = {"model_type": "deepseek_v2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "vocab_size": 100, "kv_lora_rank": 32, "q_lora_rank": None,
           "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16}
    attention = 64 * 4 * 24 + 64 * (32 + 8) + 32 + 32 * 4 * (16 + 16) + 4 * 16 * 64
    layer = attention + 3 * 64 * 128 + 2 * 64
    assert count_params(cfg).total == 2 * layer + 2 * 100 * 64 + 64
    assert kv_cache_bytes(cfg).bytes_per_token == 2 * (32 + 8) * 2


def _hybrid_config() -> dict:
    return {"model_type": "qwen3_next", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
            "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
            "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "max_position_embeddings": 1024}


def test_hybrid_linear_attention_bounded_per_sequence() -> None:
    cfg = _hybrid_config()
    kv = kv_cache_bytes(cfg)
    assert (kv.num_full_layers, kv.num_linear_layers) == (1, 3)
    assert kv.bytes_per_token == 2 * 2 * 16 * 2  # only the full-attention layer grows per token
    conv_dim = 2 * 2 * 8 + 4 * 8
    per_layer_state = conv_dim * 3 * 2 + 4 * 8 * 8 * 2  # conv state (kernel - 1) + recurrent state, BF16
    assert kv.linear_state_bytes_per_seq == 3 * per_layer_state
    assert kv.bytes_per_sequence(1000) - kv.bytes_per_sequence(10) == 990 * kv.bytes_per_token
    assert kv_cache_bytes(cfg, state_dtype="fp32").linear_state_bytes_per_seq == 3 * (conv_dim * 3 * 2 + 4 * 8 * 8 * 4)
    # Gated DeltaNet block params and the output-gated full attention of Qwen3-Next.
    gdn = 64 * (2 * 2 * 8 + 2 * 4 * 8) + 64 * 2 * 4 + 4 * 8 * 64 + conv_dim * 4 + 2 * 4 + 8
    full = 64 * 4 * 16 * 2 + 2 * 64 * 2 * 16 + 4 * 16 * 64 + 2 * 16
    layers = 3 * gdn + full + 4 * (3 * 64 * 128 + 2 * 64)
    assert count_params(cfg).total == layers + 2 * 100 * 64 + 64


def test_sliding_window_layers_bounded_per_sequence() -> None:
    cfg = {**_hybrid_config(), "model_type": "gpt_like", "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 2}
    kv = kv_cache_bytes(cfg)
    layer = 2 * 2 * 16 * 2
    assert (kv.bytes_per_token, kv.sliding_bytes_per_token, kv.sliding_window) == (2 * layer, 2 * layer, 128)
    assert kv.sliding_tokens_per_seq(100, max_in_flight_tokens=64) == 100
    assert kv.sliding_tokens_per_seq(10_000, max_in_flight_tokens=64) == 128 - 1 + 64
    assert kv.bytes_per_sequence(10_000, 64) == 10_000 * 2 * layer + 191 * 2 * layer
    mistral = {**_config("Llama-3.1-8B"), "sliding_window": 4096}  # all layers sliding, as Mistral-7B-v0.1
    assert kv_cache_bytes(mistral).num_sliding_layers == 32
    qwen = {**_config("Llama-3.1-8B"), "sliding_window": 4096, "use_sliding_window": False}
    assert kv_cache_bytes(qwen).num_sliding_layers == 0


def test_weight_bytes_per_format_match_model_math() -> None:
    counts = count_params(CONFIGS / "Qwen3-4B.json")
    assert weight_bytes(counts, "bf16") == 2 * 4_022_468_096
    expected_gb = {"bf16": 8.04, "fp8": 4.41, "int4": 2.67, "nvfp4": 2.82}  # model-math.md, Qwen3-4B
    for dtype, gb in expected_gb.items():
        assert round(weight_bytes(counts, dtype) / 1e9, 2) == gb, dtype
    # Embedding (tied), norms stay BF16; only the decoder linear layers shrink.
    bf16_part = 2 * (counts.embedding + counts.other)
    assert weight_bytes(counts, "int8") == counts.linear_total + bf16_part
    assert weight_bytes(counts, "mxfp4") == math.ceil(counts.linear_total * 4.25 / 8) + bf16_part
    with pytest.raises(ValueError, match="use one of"):
        weight_bytes(counts, "int3")


def test_active_weight_bytes_of_a_moe() -> None:
    counts = count_params(CONFIGS / "Qwen3-30B-A3B.json")
    assert active_weight_bytes(counts, "bf16") == 2 * 3_353_032_704


def test_safetensors_header_bytes_are_exact(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    tensors = {"a": np.zeros((3, 5), np.float16), "b": np.zeros((7,), np.float32), "c": np.zeros((2, 2, 2), np.int8)}
    save_file(tensors, str(tmp_path / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file({"d": np.zeros((4, 4), np.float16)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    result = safetensors_bytes(tmp_path)
    assert result is not None
    assert result.bytes_by_dtype == {"F16": 30 + 32, "F32": 28, "I8": 8}
    assert result.total_bytes == 98
    assert result.num_tensors == 4
    header = read_safetensors_header(tmp_path / "model-00001-of-00002.safetensors")
    assert header["b"]["shape"] == [7] and header["__metadata__"] == {"format": "pt"}


def test_safetensors_index_only_and_broken_files(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 123456},
                                                                      "weight_map": {}}))
    assert safetensors_bytes(tmp_path).total_bytes == 123456
    assert safetensors_bytes(tmp_path / "missing") is None
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes((10**6).to_bytes(8, "little") + b"{}")
    with pytest.raises(ConfigError, match="header longer than the file"):
        read_safetensors_header(broken)


def test_plan_uses_exact_checkpoint_bytes_when_present(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN3))
    save_file({"w": np.zeros((10, 10), np.float16)}, str(tmp_path / "model.safetensors"))
    plan = plan_memory(tmp_path)
    assert (plan.weight_bytes, plan.weight_bytes_source) == (200, "safetensors headers")
    estimate = plan_memory(tmp_path, weight_dtype="bf16")
    assert estimate.weight_bytes == 2 * count_params(TINY_QWEN3).total


def test_cpu_kv_sizing_matches_what_vllm_reported() -> None:
    # cpu-lab.md: tiny Qwen3, VLLM_CPU_KVCACHE_SPACE=1 -> kv_cache_size_tokens 524,288, num_gpu_blocks 4,096.
    kv = kv_cache_bytes(TINY_QWEN3)
    assert kv.bytes_per_token == 2048
    cache = cpu_kv_cache(kv, max_model_len=4096, kv_cache_space_gib=1)
    assert (cache.block_size, cache.num_blocks, cache.kv_cache_tokens) == (128, 4096, 524_288)
    assert cache.vllm_kv_cache_size_tokens == 524_288
    assert cache.max_concurrency == 128.0
    assert cpu_kv_cache(kv, 4096, kv_cache_memory_bytes=1 << 30) == cache


def test_vllm_reports_tokens_from_concurrency_not_slots() -> None:
    kv = kv_cache_bytes(TINY_QWEN3)
    cache = cpu_kv_cache(kv, max_model_len=1000, kv_cache_space_gib=1)
    assert cache.blocks_per_request == 8
    assert cache.max_concurrency == 4096 / 8
    assert cache.kv_cache_tokens == 524_288  # slots
    assert cache.vllm_kv_cache_size_tokens == 512_000  # get_kv_cache_capacity: int(concurrency * max_model_len)


@pytest.mark.parametrize("kv_memory", [0, 1, 12_345_678_901, 987_654_321, 2**34 + 17])
def test_num_blocks_is_memory_over_page_over_layers(kv_memory: int) -> None:
    kv = kv_cache_bytes(CONFIGS / "Llama-3.1-8B.json")
    cache = vllm_kv_cache(kv, kv_memory, max_model_len=8192, block_size=16)
    page = 2 * 16 * 8 * 128 * 2
    assert cache.page_bytes == page
    assert cache.num_blocks == kv_memory // page // 32


def _attention_model(kinds: str, window: int | None, nkv: int, head_dim: int) -> dict:
    types = {"s": "sliding_attention", "f": "full_attention"}
    return {"model_type": "test", "hidden_size": nkv * head_dim, "intermediate_size": 8, "num_hidden_layers": len(kinds),
            "num_attention_heads": nkv, "num_key_value_heads": nkv, "head_dim": head_dim, "vocab_size": 10,
            "sliding_window": window, "layer_types": [types[k] for k in kinds]}


# (num_gpu_blocks, kv_cache_size_tokens) from vLLM 0.32.0's own get_kv_cache_configs + get_kv_cache_capacity,
# called on hand-built layer specs (FullAttentionSpec / SlidingWindowSpec / MLAAttentionSpec, BF16 unless fp8).
VLLM_SIZING = [
    # model, kv dtype, kv memory bytes, max_model_len, block, in-flight tokens, num_blocks, kv_cache_size_tokens
    (TINY_QWEN3, "bf16", 123_456_789, 3000, 128, 2048, 470, 58_750),
    (CONFIGS / "Llama-3.1-8B.json", "fp8", 7_777_777_777, 5000, 16, 2048, 7417, 118_482),
    (CONFIGS / "DeepSeek-V3.json", "bf16", 20_000_000_000, 4096, 16, 2048, 17_788, 284_608),
    (_attention_model("sf" * 12, 128, 8, 64), "bf16", 10_000_000_000, 8192, 16, 2048, 25_431, 321_002),
    (_attention_model("sf" * 12, 128, 8, 64), "bf16", 10_000_000_000, 8192, 16, 4096, 25_431, 268_121),
    (_attention_model("s" * 12 + "f" * 13, 128, 8, 64), "bf16", 7_654_321_000, 131_072, 16, 8192, 17_968, 270_297),
    (_attention_model("sssssf" * 10 + "ss", 1024, 16, 128), "bf16", 20_000_000_000, 32_768, 16, 2048, 15_258, 155_949),
    (_attention_model("s" * 32, 4096, 8, 128), "bf16", 5_000_000_000, 1000, 128, 2048, 298, 33_111),
]


@pytest.mark.parametrize("model,kv_dtype,kv_memory,max_len,block,in_flight,num_blocks,tokens", VLLM_SIZING)
def test_sizing_matches_vllm_functions(model, kv_dtype: str, kv_memory: int, max_len: int, block: int,
                                       in_flight: int, num_blocks: int, tokens: int) -> None:
    cache = vllm_kv_cache(kv_cache_bytes(model, kv_dtype), kv_memory, max_len, block, in_flight)
    assert (cache.num_blocks, cache.vllm_kv_cache_size_tokens) == (num_blocks, tokens)
    assert cache.exact


def test_linear_attention_sizing_is_flagged_approximate() -> None:
    kv = kv_cache_bytes(_hybrid_config())
    cache = vllm_kv_cache(kv, 10**9, 1024, 16)
    assert not cache.exact
    assert cache.max_concurrency == 10**9 / (64 * 16 * kv.bytes_per_token + kv.linear_state_bytes_per_seq)


def test_startup_needs_one_request_beside_the_null_block() -> None:
    kv = kv_cache_bytes(TINY_QWEN3)
    per_block = 16 * kv.bytes_per_token
    needed = math.ceil(4096 / 16)
    assert vllm_kv_cache(kv, (needed + 1) * per_block, 4096).fits
    assert not vllm_kv_cache(kv, (needed + 1) * per_block - 1, 4096).fits


def test_mla_on_cpu_uses_block_16() -> None:
    kv = kv_cache_bytes(CONFIGS / "DeepSeek-V3.json")
    cache = cpu_kv_cache(kv, max_model_len=4096, kv_cache_space_gib=4)
    assert cache.block_size == 16
    assert cache.num_blocks == 4 * 2**30 // (16 * 576 * 2) // 61


def test_gpu_budget_uses_total_memory_and_refuses_what_does_not_fit() -> None:
    assert gpu_kv_memory_bytes(10**9, 0.5, 100, 50) == 500_000_000 - 150
    assert gpu_kv_memory_bytes(3, 0.5, 0, 0) == 2  # ceil, as vllm's request_memory
    # model-math.md: Qwen3-4B BF16 on a 20 GB RTX 4000 Ada at utilization 0.40 left no KV blocks.
    plan = plan_memory(CONFIGS / "Qwen3-4B.json", gpu="RTX 4000 Ada", gpu_memory_utilization=0.40,
                              max_model_len=4096)
    assert plan.kv_cache is not None and plan.kv_cache.num_blocks == 0 and not plan.kv_cache.fits
    assert plan.kv_cache.kv_memory_bytes < 0


def test_gpu_plan_arithmetic() -> None:
    plan = plan_memory(CONFIGS / "Llama-3.1-8B.json", gpu="h100-sxm", max_model_len=8192, overhead_bytes=2 * 2**30)
    weights = 2 * 8_030_261_248
    kv_memory = math.ceil(81559 * 2**20 * 0.92) - weights - 2 * 2**30  # nvidia-smi total of an "80GB" H100
    cache = plan.kv_cache
    assert cache is not None and cache.kv_memory_bytes == kv_memory
    assert cache.num_blocks == kv_memory // (16 * 131_072)
    assert cache.kv_cache_tokens == cache.num_blocks * 16
    assert cache.max_concurrency == cache.num_blocks / 512
    assert plan.gpu == "H100 SXM" and plan.overhead.total_bytes == 2 * 2**30


def test_gpu_scheduler_defaults_follow_vllm() -> None:
    assert vllm_gpu_scheduler_defaults(80 * 10**9, "H100 SXM") == (8192, 1024)
    assert vllm_gpu_scheduler_defaults(80 * 10**9, "A100 80GB SXM") == (2048, 256)
    assert vllm_gpu_scheduler_defaults(180 * 10**9, "B200") == (16384, 1024)
    assert vllm_gpu_scheduler_defaults(24 * 10**9, "L4") == (2048, 256)
    plan = plan_memory(CONFIGS / "Llama-3.1-8B.json", gpu="H100 SXM", max_model_len=8192)
    assert plan.overhead == estimate_overhead(CONFIGS / "Llama-3.1-8B.json", 8192, 1024)


def test_estimated_overhead_is_documented_sum() -> None:
    overhead = estimate_overhead(CONFIGS / "Llama-3.1-8B.json", max_num_batched_tokens=8192)
    assert overhead.activation_bytes == 8192 * (3 * 14336 + 6 * 4096) * 2 + 256 * 128256 * 8
    assert overhead.total_bytes == overhead.activation_bytes + NON_TORCH_BYTES + CUDA_GRAPH_BYTES
    assert estimate_overhead(CONFIGS / "Llama-3.1-8B.json", enforce_eager=True).cuda_graph_bytes == 0


def test_config_errors_say_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config file"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="'hidden_size'"):
        count_params({k: v for k, v in _config("Qwen3-4B").items() if k != "hidden_size"})
    with pytest.raises(ConfigError, match="num_attention_heads=0: expected an integer >= 1"):
        count_params({**_config("Qwen3-4B"), "num_attention_heads": 0})
    with pytest.raises(ConfigError, match="hidden_size='big'"):
        count_params({**_config("Qwen3-4B"), "hidden_size": "big"})
    with pytest.raises(ConfigError, match="linear_num_key_heads"):
        count_params({k: v for k, v in _hybrid_config().items() if k != "linear_num_key_heads"})


def test_predict_cpu_engine_kv_reads_the_engine_flags():
    from helpers.lessons.l02_memory import compare_with_engine, predict_cpu_engine_kv

    args = ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager"]
    predicted = predict_cpu_engine_kv(REFERENCE_CONFIGS / "Qwen3-0.6B.json", args)
    assert predicted.block_size == 128
    assert predicted.num_blocks == (1 << 30) // (128 * 114_688)  # one block of all 28 layers: 128 x 114,688 B
    table = compare_with_engine(predicted, {"num_gpu_blocks": predicted.num_blocks})
    assert table.loc["num_gpu_blocks", "vLLM reports"] == predicted.num_blocks
    assert table.loc["block_size", "vLLM reports"] != table.loc["block_size", "predicted"]  # missing, not equal
    with pytest.raises(ConfigError, match="--kv-cache-memory-bytes"):
        predict_cpu_engine_kv(REFERENCE_CONFIGS / "Qwen3-0.6B.json", ["--enforce-eager"])


# ---------------------------------------------------------------- GiB rows, fit verdicts and conclusions

from helpers.core.conclusion import NOT_SHOWN, SHOWN  # noqa: E402


def _rows(gpu="RTX 4000 Ada", model="Qwen3-4B", max_model_len=16384):
    cfg = CONFIGS / f"{model}.json"
    return [plan_row(plan_memory(cfg, gpu=gpu, weight_dtype=w, kv_dtype=k, gpu_memory_utilization=0.9,
                                               max_model_len=max_model_len), 8192)
            for w, k in (("bf16", "bf16"), ("fp8", "bf16"), ("fp8", "fp8"))]


def test_plan_row_is_in_gib_of_the_reported_memory():
    row = _rows(gpu="H100 SXM")[0]
    assert row["memory_gib"] == pytest.approx(81559 / 1024)
    assert row["budget_gib"] == pytest.approx(81559 / 1024 * 0.9)
    assert row["block_size"] == 16 and "weights_gb" not in row


def test_memory_conclusion_when_everything_fits():
    from helpers.lessons.l02_memory import conclude_memory_plan

    bf16, fp8, fp8_kv = _rows()
    out = conclude_memory_plan("Qwen3-4B", "RTX 4000 Ada", 0.9, bf16, fp8, fp8_kv, 8192)
    assert "GiB for BF16 weights" in out[0].text and "conversation" in out[0].text
    assert out[1].verdict == SHOWN and out[2].verdict == SHOWN


def test_memory_conclusion_says_when_the_weights_do_not_fit():
    from helpers.lessons.l02_memory import conclude_memory_plan

    bf16, fp8, fp8_kv = _rows(gpu="L4", model="Qwen3-30B-A3B")
    out = conclude_memory_plan("Qwen3-30B-A3B", "L4", 0.9, bf16, fp8, fp8_kv, 8192)
    assert "does not fit" in out[0].text and "GiB of weights" in out[0].text
    assert out[1].verdict == NOT_SHOWN  # FP8 weights do not fit either: no KV cache to grow


def test_fit_title_grammar_and_the_refusal_to_start():
    row = dict(_rows()[0], requests_at_max_len=1, **{"conversations_of_8192_tokens": 3})
    title = fit_title(row, 8192)
    assert ": fits 1 conversation of max_model_len 16,384 tokens at once (3 of 8,192 tokens)" in title
    assert f"({row['memory_gib']:.2f} GiB as nvidia-smi reports)" in title and "does not fit" not in title
    too_long = dict(row, fits=False, budget_gib=100.0, max_model_len=10**6)
    assert "does not fit: max_model_len 1,000,000 tokens is above" in fit_title(too_long, 8192)
    assert "vLLM refuses to start" in fit_title(too_long, 8192)


def test_fit_verdict_names_the_weights_the_overhead_or_max_model_len():
    fits = {"weights_gib": 7.5, "overhead_gib": 1.5, "budget_gib": 18.0, "memory_gib": 20.0, "fits": True,
            "max_model_len": 16384, "kv_cache_tokens": 65840}
    assert fit_verdict(fits) == ""
    alone = fit_verdict(dict(fits, weights_gib=67.7, fits=False))
    assert alone.startswith("does not fit: the weights alone (67.7 GiB of weights) exceed the 18.0 GiB budget")
    with_overhead = fit_verdict(dict(fits, weights_gib=17.0, fits=False))
    assert with_overhead.startswith("does not fit: 17.0 GiB of weights + 1.5 GiB of vLLM overhead fill")
    too_long = fit_verdict(dict(fits, max_model_len=70000, fits=False))
    assert too_long.startswith("does not fit: max_model_len 70,000 tokens is above the KV cache's 65,840 tokens")
    problems = [fit_problem(dict(fits, **change)) for change in
                ({}, {"weights_gib": 67.7, "fits": False}, {"weights_gib": 17.0, "fits": False}, {"fits": False})]
    assert problems == ["", "weights", "overhead", "max_model_len"]


def test_engine_comparison_verdict_flips_when_the_numbers_differ():
    from helpers.lessons.l02_memory import compare_with_engine, conclude_engine_comparison

    kv = kv_cache_bytes(CONFIGS / "Qwen3-4B.json")
    predicted = cpu_kv_cache(kv, 4096, kv_cache_memory_bytes=2**30)
    same = compare_with_engine(predicted, {"num_gpu_blocks": predicted.num_blocks, "block_size": 128,
                                                  "kv_cache_size_tokens": predicted.vllm_kv_cache_size_tokens})
    other = compare_with_engine(predicted, {"num_gpu_blocks": 1, "block_size": 128,
                                                   "kv_cache_size_tokens": predicted.vllm_kv_cache_size_tokens + 128})
    assert conclude_engine_comparison(same, "cpu").verdict == SHOWN
    assert conclude_engine_comparison(other, "cpu").verdict == NOT_SHOWN


def test_block_size_note_names_both_defaults():
    from helpers.lessons.l02_memory import block_size_note

    note = block_size_note(128, "cpu")
    assert "128 tokens" in note and "16 is vLLM's default on a GPU" in note


def test_a_config_that_leaves_something_out_gets_a_note_saying_what_was_assumed() -> None:
    assert model_shape(CONFIGS / "Llama-3.1-8B.json").notes == ()  # a known architecture, every field given
    no_gqa_field = {k: v for k, v in _config("Llama-3.1-8B").items() if k != "num_key_value_heads"}
    shape = model_shape(no_gqa_field)
    assert shape.num_kv_heads == shape.num_heads == 32  # transformers' default: one KV head per query head
    [note] = shape.notes
    assert "no num_key_value_heads: assumed 32, equal to num_attention_heads (no grouped-query attention)" in note
    assert kv_cache_bytes(no_gqa_field).bytes_per_token == 4 * 131_072  # 32 KV heads instead of 8
    unknown = model_shape({**_config("Llama-3.1-8B"), "model_type": "falcon_h9"})
    assert len(unknown.notes) == 1 and "model_type 'falcon_h9' is not an architecture the planner knows" in unknown.notes[0]
    untyped = model_shape({k: v for k, v in _config("Llama-3.1-8B").items() if k != "model_type"})
    assert "config.json has no model_type" in untyped.notes[0]
    mla = {k: v for k, v in _config("DeepSeek-V3").items() if k != "num_key_value_heads"}
    assert model_shape(mla).notes == ()  # MLA caches a latent: the KV head count does not size it
    plan = plan_memory(no_gqa_field, gpu="H100 SXM")
    assert plan.notes == shape.notes


def test_engine_comparison_predicts_only_when_the_engine_flags_and_model_config_are_here():
    from helpers.lessons.l02_memory import conclude_engine_comparison, engine_comparison
    from helpers.core.settings import models_dir

    reported = {"num_gpu_blocks": 4096, "block_size": 128, "kv_cache_size_tokens": 524288}
    args = ["--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30)]
    local = engine_comparison(models_dir() / "tiny-agent", args, reported)
    assert "predicted" in local and local.loc["kv_cache_size_tokens", "vLLM reports"] == 524288
    external = engine_comparison("tiny-agent", [], reported)  # VLLM_HOST: neither flags nor the config here
    assert list(external.columns) == ["vLLM reports"] and external.loc["block_size", "vLLM reports"] == 128
    assert "not an engine the helpers started" in conclude_engine_comparison(external, "cpu").text
    assert "On a GPU" in conclude_engine_comparison(external, "gpu").text
    assert list(engine_comparison(models_dir() / "tiny-agent", args[:2], None).columns) == ["vLLM reports"]


def _conv_row(kv_tokens, conversations, at_max_len, fits=True, **extra):
    return {"kv_cache_tokens": kv_tokens, "conversations_of_8192_tokens": conversations, "requests_at_max_len": at_max_len,
            "fits": fits, "max_model_len": 16384, **extra}


def test_conversations_outcome_names_the_change_or_the_refusal():
    from helpers.lessons.l02_memory import CONVERSATION_CHOICES, conversations_outcome

    before = _conv_row(65840, 8, 4)
    assert conversations_outcome(before, _conv_row(131696, 16, 8), 8192)[0] == "about twice as many or more"
    same, detail = conversations_outcome(before, _conv_row(65840, 8, 1), 8192)
    assert same == "about the same" and "8 -> 8 conversations" in detail and "4 -> 1" in detail
    assert conversations_outcome(before, _conv_row(40000, 4, 2), 8192)[0] == "fewer"
    assert conversations_outcome(before, _conv_row(90000, 11, 5), 8192)[0] == "more, but less than twice"
    refused, why = conversations_outcome(before, _conv_row(65840, 8, 0, fits=False, max_model_len=131072), 8192)
    assert refused == CONVERSATION_CHOICES[0] and "does not fit: max_model_len 131,072" in why


def test_a_longer_max_model_len_outcome_says_why_both_ways():
    from helpers.lessons.l02_memory import CONVERSATION_CHOICES, longer_max_len_outcome

    before = _conv_row(65840, 8, 4)
    same, detail = longer_max_len_outcome(before, _conv_row(65840, 8, 1, max_model_len=32768), 8192)
    assert same == "about the same" and "8 -> 8 conversations" in detail and "only raises the cap" in detail
    refused, why = longer_max_len_outcome(before, _conv_row(65840, 8, 0, fits=False, max_model_len=131072), 8192)
    assert refused == CONVERSATION_CHOICES[0] and "only raises the cap" not in why and "refuses" in why


def test_larger_gpus_hold_more_is_judged_on_the_counts():
    import pandas as pd

    from helpers.lessons.l02_memory import larger_gpus_hold_more

    rows = pd.DataFrame({"gpu": ["A", "B", "C"], "memory_gib": [20.0, 80.0, 40.0], "weights_gib": [7.5] * 3,
                         "fits": [True] * 3, "conversations_of_8192_tokens": [2, 30, 12]})
    seen, detail = larger_gpus_hold_more(rows, 8192)
    assert seen and detail.index("A (20.0 GiB): 2") < detail.index("C (40.0 GiB): 12") < detail.index("B (80.0 GiB): 30")
    assert not larger_gpus_hold_more(rows.assign(conversations_of_8192_tokens=[2, 1, 12]), 8192)[0]
    assert not larger_gpus_hold_more(rows.assign(weights_gib=[7.5, 3.0, 7.5]), 8192)[0]


def test_the_hand_count_is_confirmed_or_refuted_by_the_planner():
    from helpers.lessons.l02_memory import conclude_hand_count
    from helpers.planning.memory import plan_memory

    config = REFERENCE_CONFIGS / "Qwen3-4B.json"
    plan = plan_memory(config)
    L, H, I, V, n_q, n_kv, d = 36, 2560, 9728, 151936, 32, 8, 128  # Qwen3-4B's config.json, tied embeddings
    by_hand = L * (H * n_q * d + 2 * H * n_kv * d + n_q * d * H + 3 * H * I) + V * H
    kv = 2 * L * n_kv * d * 2
    agrees = conclude_hand_count("Qwen3-4B", by_hand, kv, plan)
    assert agrees.verdict == SHOWN and "+0.005%" in agrees.text and "147,456" in agrees.text
    assert conclude_hand_count("Qwen3-4B", by_hand, kv * 2, plan).verdict == NOT_SHOWN  # K and V counted twice
    assert conclude_hand_count("Qwen3-4B", by_hand + V * H, kv, plan).verdict == NOT_SHOWN  # an untied LM head
    moe = conclude_hand_count("Qwen3-30B-A3B", by_hand, kv, plan_memory(REFERENCE_CONFIGS / "Qwen3-30B-A3B.json"))
    assert moe.verdict == "" and "not" in moe.text  # the dense formulas do not describe experts: cannot tell
