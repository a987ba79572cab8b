"""A model's shape from its config.json: the architecture fields, and the parameters they make.

A model is given as a directory holding ``config.json`` (and maybe ``*.safetensors`` or
``model.safetensors.index.json``), a path to a ``config.json``, or an already parsed dict.
Only the text model counts: a vision-language config's ``text_config`` is planned, its vision
tower is not. DeepSeek's multi-token-prediction layers (``num_nextn_predict_layers``) are not
counted either: vLLM loads them only for speculative decoding.

Formulas: parameter shapes as Hugging Face transformers builds each layer from config.json.

gpt-oss (``model_type`` "gpt_oss"; transformers' ``GptOssConfig`` and ``modeling_gpt_oss.py``): q/k/v/o with
biases, one learned attention-sink logit per head, alternating sliding-window (128) and full layers, a router
with a bias, and experts with gate_up and down biases. The published configs (gpt-oss-120b: 36 layers, 128
experts; gpt-oss-20b: 24 layers, 32 experts; both hidden 2880, expert width 2880, 64 query heads of 64, 8 KV
heads, vocabulary 201,088, top-4; https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json and
.../gpt-oss-20b/blob/main/config.json as quoted in public code, read 2026-12-01) declare
``quant_method: mxfp4`` with ``modules_to_not_convert`` = self_attn, router, embed_tokens, lm_head: the checkpoint
stores only the expert matrices as MXFP4 (``*_blocks`` uint8, two 4-bit values a byte, and ``*_scales`` uint8,
one 8-bit exponent per 32 values: 4.25 bits), and attention, sinks, router, expert biases, embeddings and norms in
BF16. OpenAI's gpt-oss-120b & gpt-oss-20b Model Card (arXiv 2508.10925, August 2025), Table 1: 116.83B and
20.91B parameters, checkpoints of 60.8 GiB and 12.8 GiB; ``tests/test_gpt_oss.py`` holds the planner to both.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Union

from helpers.core.errors import WorkshopError

ModelSource = Union[str, os.PathLike, Mapping[str, Any]]

REFERENCE_CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"  # published config.json files, by model name
GIB = 1 << 30  # vLLM's GiB_bytes (vllm/utils/mem_constants.py)


# The model_type values whose layers the planner builds as transformers does (the families the code below
# special-cases, and the Llama-style ones it counts as they are); any other is counted as a Llama-style
# decoder, and the plan says so.
KNOWN_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl",
    "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text", "gemma2", "gemma3", "gemma3_text", "deepseek_v2",
    "deepseek_v3", "kimi_k2", "gpt_oss",
})


class ConfigError(WorkshopError, ValueError):
    """A model config that is missing, unreadable or lacks a field the planner needs."""


# ---------------------------------------------------------------------------------------------
# Reading the config


def load_config(source: ModelSource) -> dict[str, Any]:
    """The parsed config.json of a model directory, a config.json path, or a dict (returned as is)."""
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"no config file at {path}: pass a model directory holding config.json or the file itself")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}): download the model's config.json again") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{path} holds a JSON {type(config).__name__}, not an object: is it a config.json?")
    return config


def _model_name(source: ModelSource, config: Mapping[str, Any]) -> str:
    if isinstance(source, Mapping):
        return str(config.get("_name_or_path") or config.get("model_type") or "model")
    path = Path(source)
    if path.is_dir() or path.name == "config.json":
        return (path if path.is_dir() else path.parent).resolve().name
    return path.stem


def _text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's fields: ``text_config`` over the top level, for vision-language configs."""
    text = config.get("text_config")
    if isinstance(text, Mapping):
        top = {k: v for k, v in config.items() if k not in ("text_config", "vision_config", "audio_config")}
        return {**top, **text}
    return dict(config)


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None, minimum: int = 0) -> int:
    """An integer field of the config; ConfigError naming the field when it is missing or malformed."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ConfigError(f"config.json lacks {key!r}, which the planner needs: is this a decoder LLM config?")
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
        raise ConfigError(f"config.json has {key}={value!r}: expected an integer >= {minimum}")
    return int(value)


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3, Kimi K2)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class LinearAttentionShape:
    """Gated DeltaNet linear-attention dimensions (Qwen3-Next, Qwen3.5)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_size: int

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution over q, k and v."""
        return 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim


_LAYER_KINDS = {"full_attention": "full", "attention": "full", "sliding_attention": "sliding",
                "linear_attention": "linear"}


@dataclass(frozen=True)
class ModelShape:
    """The architecture fields of a decoder LLM that memory planning needs."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    layer_kinds: tuple[str, ...]  # per layer: "full", "sliding" or "linear"
    moe_layers: tuple[bool, ...]  # per layer: routed experts replace the dense MLP
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # total width of the shared expert(s)
    shared_expert_gate: bool = False
    router_bias: bool = False
    expert_bias: bool = False  # gpt-oss: a bias on every expert's gate_up (2*I_moe) and down (H) projection
    attention_sinks: bool = False  # gpt-oss: one learned softmax-denominator logit per query head
    quantize_attention: bool = True  # False when quantization_config keeps self_attn unconverted (gpt-oss)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    attn_output_gate: bool = False
    sliding_window: int | None = None
    max_position_embeddings: int | None = None
    mla: MLAShape | None = None
    linear_attention: LinearAttentionShape | None = None
    quantization_config: Mapping[str, Any] | None = field(default=None, compare=False)
    notes: tuple[str, ...] = field(default=(), compare=False)  # assumptions the config left the planner to make

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return sum(self.moe_layers)


def _layer_kinds(cfg: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if len(layer_types) != num_layers:
            raise ConfigError(f"config.json has {len(layer_types)} layer_types for {num_layers} layers: fix the config")
        unknown = sorted({t for t in layer_types if t not in _LAYER_KINDS})
        if unknown:
            raise ConfigError(f"unknown layer_types {unknown}: the planner knows {sorted(_LAYER_KINDS)}")
        return tuple(_LAYER_KINDS[t] for t in layer_types)
    if cfg.get("full_attention_interval"):  # Qwen3-Next: every n-th layer is full attention
        n = int(cfg["full_attention_interval"])
        return tuple("full" if (i + 1) % n == 0 else "linear" for i in range(num_layers))
    if cfg.get("sliding_window") and cfg.get("sliding_window_pattern"):  # Gemma 3 before layer_types
        n = int(cfg["sliding_window_pattern"])
        return tuple("full" if (i + 1) % n == 0 else "sliding" for i in range(num_layers))
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):  # e.g. Mistral-7B-v0.1
        return ("sliding",) * num_layers
    return ("full",) * num_layers


def _moe_layers(cfg: Mapping[str, Any], num_layers: int, num_experts: int) -> tuple[bool, ...]:
    if num_experts <= 0:
        return (False,) * num_layers
    mlp_only = set(cfg.get("mlp_only_layers") or [])  # Qwen-MoE
    step = int(cfg.get("decoder_sparse_step") or 1)  # Qwen-MoE: every step-th layer is sparse
    first_dense = int(cfg.get("first_k_dense_replace") or 0)  # DeepSeek: the first k layers are dense
    freq = int(cfg.get("moe_layer_freq") or 1)  # DeepSeek
    return tuple(i not in mlp_only and (i + 1) % step == 0 and i >= first_dense and i % freq == 0
                 for i in range(num_layers))


def _assumption_notes(cfg: Mapping[str, Any], model_type: str, num_heads: int, mla: bool) -> tuple[str, ...]:
    """What the planner had to assume about this config, in sentences a plan prints beside its figures."""
    notes = []
    if model_type not in KNOWN_MODEL_TYPES:
        which = f"model_type {model_type!r} is" if model_type else "config.json has no model_type, so it is"
        notes.append(f"{which} not an architecture the planner knows (Llama, Mistral, Mixtral, Qwen2/Qwen3 dense, "
                     "MoE, Next and VL, Gemma 2/3, DeepSeek-V2/V3, Kimi K2, gpt-oss): its parameters are counted as "
                     "for a Llama-style decoder (q/k/v/o projections, a gated MLP, two norms per layer); compare the total "
                     "with the model card")
    if "num_key_value_heads" not in cfg and not mla:
        notes.append(f"config.json has no num_key_value_heads: assumed {num_heads}, equal to num_attention_heads "
                     "(no grouped-query attention), as transformers does; if the model uses GQA its KV cache is "
                     "smaller than shown")
    return tuple(notes)


def _keeps_attention_unquantized(quantization: Mapping[str, Any] | None) -> bool:
    """True when a quantization_config's ``modules_to_not_convert`` names the attention blocks (gpt-oss)."""
    skipped = (quantization or {}).get("modules_to_not_convert") or []
    return any("self_attn" in str(pattern) for pattern in skipped)


def model_shape(source: ModelSource | ModelShape) -> ModelShape:
    """Parse the architecture of a model directory, config.json path or dict (a ModelShape passes through)."""
    if isinstance(source, ModelShape):
        return source
    top = load_config(source)
    cfg = _text_config(top)
    model_type = str(cfg.get("model_type") or "")
    num_layers = _int(cfg, "num_hidden_layers", minimum=1)
    hidden = _int(cfg, "hidden_size", minimum=1)
    num_heads = _int(cfg, "num_attention_heads", minimum=1)
    num_kv_heads = _int(cfg, "num_key_value_heads", default=num_heads, minimum=1)
    head_dim = _int(cfg, "head_dim", default=hidden // num_heads, minimum=1)
    num_experts = (_int(cfg, "num_experts", 0) or _int(cfg, "n_routed_experts", 0)
                   or _int(cfg, "num_local_experts", 0))
    moe_layers = _moe_layers(cfg, num_layers, num_experts)
    kinds = _layer_kinds(cfg, num_layers)
    intermediate = _int(cfg, "intermediate_size", 0)
    if not all(moe_layers) and intermediate <= 0:
        raise ConfigError("config.json lacks 'intermediate_size', which the planner needs for the dense MLP layers")

    mla = None
    if cfg.get("kv_lora_rank"):
        mla = MLAShape(
            q_lora_rank=_int(cfg, "q_lora_rank", 0) or None,
            kv_lora_rank=_int(cfg, "kv_lora_rank"),
            qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
            qk_nope_head_dim=_int(cfg, "qk_nope_head_dim"),
            v_head_dim=_int(cfg, "v_head_dim"),
        )
    linear = None
    if "linear" in kinds:
        linear = LinearAttentionShape(
            num_key_heads=_int(cfg, "linear_num_key_heads", minimum=1),
            num_value_heads=_int(cfg, "linear_num_value_heads", minimum=1),
            key_head_dim=_int(cfg, "linear_key_head_dim", minimum=1),
            value_head_dim=_int(cfg, "linear_value_head_dim", minimum=1),
            conv_kernel_size=_int(cfg, "linear_conv_kernel_dim", minimum=1),
        )

    moe_inter = shared_inter = experts_per_token = 0
    if num_experts:
        moe_inter = _int(cfg, "moe_intermediate_size", intermediate, minimum=1)  # Mixtral: intermediate_size
        experts_per_token = _int(cfg, "num_experts_per_tok", minimum=1)
        shared_inter = _int(cfg, "n_shared_experts", 0) * moe_inter  # DeepSeek: n shared experts of I_moe each
        shared_inter += _int(cfg, "shared_expert_intermediate_size", 0)  # Qwen2-MoE, Qwen3-Next

    # Llama-style attention_bias puts biases on q, k, v and o; Qwen2 has q/k/v biases without the flag.
    if "attention_bias" in cfg:
        qkv_bias = o_bias = bool(cfg["attention_bias"])
    else:
        qkv_bias, o_bias = model_type.startswith("qwen2"), False
    gemma_like = model_type.startswith(("gemma2", "gemma3"))
    gpt_oss = model_type == "gpt_oss"
    quantization = top.get("quantization_config") or cfg.get("quantization_config")
    return ModelShape(
        name=_model_name(source, top),
        model_type=model_type,
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=_int(cfg, "vocab_size", minimum=1),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        layer_kinds=kinds,
        moe_layers=moe_layers,
        num_experts=num_experts,
        experts_per_token=experts_per_token,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared_inter,
        shared_expert_gate=bool(cfg.get("shared_expert_intermediate_size")),  # Qwen: sigmoid gate Linear(H, 1)
        router_bias=cfg.get("topk_method") == "noaux_tc" or gpt_oss,  # DeepSeek-V3: e_score_correction_bias
        expert_bias=gpt_oss,
        attention_sinks=gpt_oss,
        quantize_attention=not _keeps_attention_unquantized(quantization),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=model_type.startswith("qwen3") or model_type.startswith("gemma3"),
        norms_per_layer=4 if gemma_like else 2,
        attn_output_gate=bool(cfg.get("attn_output_gate", model_type.startswith("qwen3_next"))),
        sliding_window=_int(cfg, "sliding_window", minimum=1) if "sliding" in kinds else None,
        max_position_embeddings=_int(cfg, "max_position_embeddings", 0) or None,
        mla=mla,
        linear_attention=linear,
        quantization_config=quantization,
        notes=_assumption_notes(cfg, model_type, num_heads, mla is not None),
    )


# ---------------------------------------------------------------------------------------------
# Parameters


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of the text model: total, active per token, and what quantization can shrink."""

    total: int
    active: int
    embedding: int  # input embedding, V*H
    lm_head: int  # V*H, or 0 when tied to the embedding
    linear_total: int  # linear-layer weights inside the decoder blocks: what weight quantization shrinks
    linear_active: int
    other: int  # norms, routers, biases, sinks, convolutions: kept in BF16
    quantizable_total: int  # the linear weights a weight format applies to: all of them, or only the MLPs and
    quantizable_active: int  # experts when quantization_config keeps attention in BF16 (gpt-oss)
    expert_params: int  # one routed expert of one layer (3*H*I_moe); 0 for dense models
    num_moe_layers: int
    num_experts: int
    experts_per_token: int


def _attention_params(s: ModelShape, kind: str) -> tuple[int, int]:
    """(linear weights, other params) of one attention or linear-attention block."""
    H = s.hidden_size
    if kind == "linear":
        la = s.linear_attention
        assert la is not None
        nk, nv, dk, dv = la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim
        linear = H * (2 * nk * dk + 2 * nv * dv) + H * 2 * nv + nv * dv * H  # in_proj_qkvz, in_proj_ba, out_proj
        other = la.conv_dim * la.conv_kernel_size + 2 * nv + dv  # conv1d (depthwise), dt_bias + A_log, gated norm
        return linear, other
    if s.mla is not None:
        m, nh = s.mla, s.num_heads
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q_linear, q_other = H * m.q_lora_rank + m.q_lora_rank * nh * qk_head, m.q_lora_rank  # + q_a_layernorm
        else:
            q_linear, q_other = H * nh * qk_head, 0
        linear = (q_linear + H * (m.kv_lora_rank + m.qk_rope_head_dim)  # kv_a_proj_with_mqa
                  + m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim)  # kv_b_proj
                  + nh * m.v_head_dim * H)  # o_proj
        return linear, q_other + m.kv_lora_rank  # + kv_a_layernorm
    q_out = s.num_heads * s.head_dim * (2 if s.attn_output_gate else 1)
    kv_out = s.num_kv_heads * s.head_dim
    linear = H * q_out + 2 * H * kv_out + s.num_heads * s.head_dim * H
    other = (q_out + 2 * kv_out if s.qkv_bias else 0) + (H if s.o_bias else 0) + (2 * s.head_dim if s.qk_norm else 0)
    return linear, other + (s.num_heads if s.attention_sinks else 0)


def _mlp_params(s: ModelShape, layer: int) -> tuple[int, int, int, int]:
    """(linear weights total, linear weights active, other params total, other params active) of one layer's
    MLP or MoE; the other params differ only by the expert biases of the experts a token does not use."""
    H = s.hidden_size
    if not s.moe_layers[layer]:
        linear = 3 * H * s.intermediate_size  # gate, up, down
        other = 2 * s.intermediate_size + H if s.mlp_bias else 0
        return linear, linear, other, other
    expert = 3 * H * s.moe_intermediate_size
    shared = 3 * H * s.shared_expert_intermediate_size
    other = H * s.num_experts + (s.num_experts if s.router_bias else 0) + (H if s.shared_expert_gate else 0)
    bias = 2 * s.moe_intermediate_size + H if s.expert_bias else 0  # gpt-oss: gate_up_proj_bias, down_proj_bias
    return (s.num_experts * expert + shared, s.experts_per_token * expert + shared,
            other + s.num_experts * bias, other + s.experts_per_token * bias)


def count_params(source: ModelSource | ModelShape) -> ParamCounts:
    """Total and active parameter counts from the config alone (no weights are read)."""
    s = model_shape(source)
    H = s.hidden_size
    linear_total = linear_active = attention_linear = 0
    other = other_active = H  # final norm
    for i, kind in enumerate(s.layer_kinds):
        a_linear, a_other = _attention_params(s, kind)
        m_total, m_active, m_other, m_other_active = _mlp_params(s, i)
        attention_linear += a_linear
        linear_total += a_linear + m_total
        linear_active += a_linear + m_active
        other += a_other + m_other + s.norms_per_layer * H
        other_active += a_other + m_other_active + s.norms_per_layer * H
    embedding = s.vocab_size * H
    lm_head = 0 if s.tie_word_embeddings else s.vocab_size * H
    kept = 0 if s.quantize_attention else attention_linear  # linear weights the checkpoint keeps in BF16
    return ParamCounts(
        total=embedding + lm_head + other + linear_total,
        active=embedding + lm_head + other_active + linear_active,
        embedding=embedding,
        lm_head=lm_head,
        linear_total=linear_total,
        linear_active=linear_active,
        other=other,
        quantizable_total=linear_total - kept,
        quantizable_active=linear_active - kept,
        expert_params=3 * H * s.moe_intermediate_size if s.num_experts else 0,
        num_moe_layers=s.num_moe_layers,
        num_experts=s.num_experts,
        experts_per_token=s.experts_per_token,
    )
