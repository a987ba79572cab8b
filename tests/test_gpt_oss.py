"""The planner on the gpt-oss family, against OpenAI's published figures.

Source: "gpt-oss-120b & gpt-oss-20b Model Card", OpenAI, August 2025 (arXiv 2508.10925), Table 1: MLP 114.71B /
19.12B, attention 0.96B / 0.64B, active parameters (unembedding counted, embedding not) 5.13B / 3.61B, total
116.83B / 20.91B, checkpoint size 60.8 GiB / 12.8 GiB. The configs are helpers/data/configs/gpt-oss-*.json
(https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json and .../gpt-oss-20b/..., see planning/shape.py).
"""

import pytest

from helpers.planning.kv import kv_cache_bytes
from helpers.planning.memory import plan_memory, plan_row
from helpers.planning.shape import GIB, REFERENCE_CONFIGS, count_params, model_shape
from helpers.planning.weights import active_weight_bytes, infer_weight_dtype, weight_bytes

# name: (total params B, active params without the embedding B, attention params B, MLP params B, checkpoint GiB)
MODEL_CARD = {"gpt-oss-120b": (116.83, 5.13, 0.96, 114.71, 60.8), "gpt-oss-20b": (20.91, 3.61, 0.64, 19.12, 12.8)}


@pytest.mark.parametrize("name", sorted(MODEL_CARD))
def test_parameter_counts_match_the_model_card(name):
    total_b, active_b, attention_b, mlp_b, _ = MODEL_CARD[name]
    shape = model_shape(REFERENCE_CONFIGS / f"{name}.json")
    counts = count_params(shape)
    assert shape.notes == ()  # a known architecture: no Llama-style guess
    assert shape.attention_sinks and shape.expert_bias and shape.router_bias and shape.qkv_bias and shape.o_bias
    assert round(counts.total / 1e9, 2) == total_b
    assert round((counts.active - counts.embedding) / 1e9, 2) == active_b
    attention = counts.linear_total - counts.quantizable_total  # q/k/v/o weights, kept in BF16 by the checkpoint
    per_layer = (64 * 64 + 2 * 8 * 64 + 2880) + 64  # q/k/v/o biases and the sinks
    assert round((attention + shape.num_layers * per_layer) / 1e9, 2) == attention_b
    mlp = counts.total - counts.embedding - counts.lm_head - attention - shape.num_layers * (per_layer + 2 * 2880) - 2880
    assert round(mlp / 1e9, 2) == mlp_b


@pytest.mark.parametrize("name", sorted(MODEL_CARD))
def test_checkpoint_bytes_within_one_percent_of_the_model_card(name):
    checkpoint_gib = MODEL_CARD[name][-1]
    config = REFERENCE_CONFIGS / f"{name}.json"
    assert infer_weight_dtype(config) == "mxfp4"
    estimate_gib = weight_bytes(config, "mxfp4") / GIB
    assert abs(estimate_gib - checkpoint_gib) / checkpoint_gib < 0.01
    plan = plan_memory(config)
    assert plan.weight_bytes == weight_bytes(config, "mxfp4") and plan.weight_dtype == "mxfp4"  # inferred
    assert "attention kept in BF16" in plan.weight_bytes_source
    assert active_weight_bytes(config, "mxfp4") < weight_bytes(config, "mxfp4") / 2  # top-4 experts per token


def test_attention_is_quantized_when_the_config_does_not_keep_it():
    cfg = dict(model_shape(REFERENCE_CONFIGS / "gpt-oss-20b.json").quantization_config or {})
    assert cfg["modules_to_not_convert"][0] == "model.layers.*.self_attn"
    import json

    raw = json.loads((REFERENCE_CONFIGS / "gpt-oss-20b.json").read_text())
    raw["quantization_config"] = {"quant_method": "mxfp4"}
    counts = count_params(raw)
    assert counts.quantizable_total == counts.linear_total
    assert weight_bytes(raw, "mxfp4") < weight_bytes(REFERENCE_CONFIGS / "gpt-oss-20b.json", "mxfp4")
    qwen = count_params(REFERENCE_CONFIGS / "Qwen3-30B-A3B.json")  # other families: every linear weight, as before
    assert (qwen.quantizable_total, qwen.quantizable_active) == (qwen.linear_total, qwen.linear_active)


def test_kv_cache_of_alternating_sliding_and_full_layers():
    kv = kv_cache_bytes(REFERENCE_CONFIGS / "gpt-oss-120b.json")
    assert (kv.num_full_layers, kv.num_sliding_layers, kv.sliding_window) == (18, 18, 128)
    assert kv.bytes_per_token == 18 * 2 * 8 * 64 * 2  # 36,864 bytes: the sinks and biases add nothing to the cache


def test_gpt_oss_120b_fits_one_80gb_gpu():
    row = plan_row(plan_memory(REFERENCE_CONFIGS / "gpt-oss-120b.json", gpu="H100 SXM", max_model_len=131072))
    assert row["fits"] and 60 < row["weights_gib"] < 61.5
