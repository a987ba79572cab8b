"""The quantized tiny-agent variants in models/ (made by quantize/quantize_tiny.py).

Unit tests read the committed files: the quantization config vLLM dispatches on, the tensors' dtypes
in the safetensors headers, the tokenizer (byte-identical to the BF16 model's) and the record that
ties each variant to the BF16 weights it was made from. The engine test serves each variant on vLLM's
CPU build and checks that it loads and answers (load and serve only; quality is in quantize/README.md).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from safetensors import safe_open

from helpers.engine.local import LocalEngine
from helpers.hardware.machine import capability, model_feature
from helpers.engine.session import connect
from helpers.core.settings import CONTRACT_VARIABLES, load_settings, models_dir

SOURCE = "tiny-agent"
ENGINE_PORT = "8767"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LAYERS = 4
HIDDEN = 256
GROUP = 128

# variant -> (what config.json's quantization_config must hold, the tensor suffix -> dtype of a quantized Linear)
EXPECTED: dict[str, tuple[dict[str, object], dict[str, str]]] = {
    "tiny-agent-fp8-dynamic": (
        {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
         "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
         "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}},
        {"weight": "F8_E4M3", "weight_scale": "BF16"}),
    "tiny-agent-w8a8": (
        {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
         "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
         "input_activations": {"num_bits": 8, "type": "int", "dynamic": True, "strategy": "token"}},
        {"weight": "I8", "weight_scale": "BF16"}),
    "tiny-agent-w4a16": (
        {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
         "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": GROUP, "symmetric": True},
         "input_activations": None},
        {"weight_packed": "I32", "weight_scale": "BF16", "weight_shape": "I64"}),
    "tiny-agent-gptq-int4": (
        {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "sym": True, "desc_act": False, "lm_head": False},
        {"qweight": "I32", "qzeros": "I32", "scales": "F16", "g_idx": "I32"}),
}
VARIANTS = sorted(EXPECTED)


def _dir(name: str) -> Path:
    return models_dir() / name


def _quantization_config(name: str) -> dict[str, object]:
    """config.json's quantization_config, with a compressed-tensors config group flattened in."""
    config = json.loads((_dir(name) / "config.json").read_text())["quantization_config"]
    groups = config.pop("config_groups", None)
    if groups:
        assert len(groups) == 1, f"{name}: expected one config group, found {list(groups)}"
        group = next(iter(groups.values()))
        assert group["targets"] == ["Linear"]
        config.update(weights=group["weights"], input_activations=group["input_activations"])
    return config


def _header(path: Path) -> dict[str, tuple[str, list[int]]]:
    """Tensor name -> (dtype, shape) from a safetensors file's header."""
    with safe_open(path, framework="pt") as fh:
        return {key: (fh.get_slice(key).get_dtype(), fh.get_slice(key).get_shape()) for key in fh.keys()}


@pytest.mark.parametrize("name", VARIANTS)
def test_quantization_config_is_what_vllm_dispatches_on(name):
    expected, _ = EXPECTED[name]
    config = _quantization_config(name)
    for key, want in expected.items():
        if isinstance(want, dict):
            assert {k: config[key][k] for k in want} == want, f"{name}: {key}"
        else:
            assert config[key] == want, f"{name}: {key}"


@pytest.mark.parametrize("name", VARIANTS)
def test_safetensors_hold_quantized_linears_and_bf16_embeddings(name):
    _, suffixes = EXPECTED[name]
    header = _header(_dir(name) / "model.safetensors")
    for layer in range(LAYERS):
        for proj in PROJECTIONS:
            block = "self_attn" if proj in PROJECTIONS[:4] else "mlp"
            prefix = f"model.layers.{layer}.{block}.{proj}."
            found = {key[len(prefix):]: dtype for key, (dtype, _) in header.items() if key.startswith(prefix)}
            assert found == suffixes, f"{name}: {prefix}"
    assert header["model.embed_tokens.weight"][0] == "BF16"
    assert "lm_head.weight" not in header  # tied to the embeddings, stored once
    assert not any(dtype in ("F32", "BF16") and key.endswith("proj.weight") for key, (dtype, _) in header.items())


def test_int4_weights_are_packed_eight_to_an_int32():
    header = _header(_dir("tiny-agent-w4a16") / "model.safetensors")
    assert header["model.layers.0.mlp.down_proj.weight_packed"][1] == [HIDDEN, 768 // 8]
    assert header["model.layers.0.mlp.down_proj.weight_scale"][1] == [HIDDEN, 768 // GROUP]
    gptq = _header(_dir("tiny-agent-gptq-int4") / "model.safetensors")
    assert gptq["model.layers.0.mlp.down_proj.qweight"][1] == [768 // 8, HIDDEN]  # GPTQ packs along the input
    assert gptq["model.layers.0.mlp.down_proj.scales"][1] == [768 // GROUP, HIDDEN]


@pytest.mark.parametrize("name", VARIANTS)
def test_tokenizer_and_template_are_the_bf16_models(name):
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (_dir(name) / file).read_bytes() == (_dir(SOURCE) / file).read_bytes(), f"{name}/{file}"


@pytest.mark.parametrize("name", VARIANTS)
def test_record_names_the_committed_bf16_weights(name):
    record = json.loads((_dir(name) / "quantization_record.json").read_text())
    source = hashlib.sha256((_dir(SOURCE) / "model.safetensors").read_bytes()).hexdigest()
    assert record["source_model"] == SOURCE and record["tool_version"] and record["seconds"] >= 0
    assert record["source_sha256"] == source, (
        f"{name} was made from other weights than models/{SOURCE}: rebuild it with quantize/build.sh")


# the quantization method vLLM reports in its engine config line for each variant's checkpoint format
VLLM_METHOD = {"tiny-agent-gptq-int4": "auto_gptq"}


@pytest.mark.engine
@pytest.mark.parametrize("name", VARIANTS)
def test_variant_loads_and_serves_on_vllm_cpu(name, tmp_path, monkeypatch):
    need = model_feature(_dir(name))
    if need and not capability(need).ok:  # e.g. the int4 kernel on an AVX2-only CPU: tests/test_forced_cpu_kind.py
        pytest.skip(f"{name}: {capability(need).reason}")
    for variable in CONTRACT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("WORKSHOP_PORT", ENGINE_PORT)  # an engine of its own per variant: each serves another model
    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("MODEL_NAME", name)
    settings = load_settings()
    try:
        lab = connect(settings)
        assert lab.check() == [name]
        reply = lab.chat([{"role": "user", "content": "hi"}], max_tokens=8)
        assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
        assert f"quantization={VLLM_METHOD.get(name, 'compressed-tensors')}," in lab.engine.logs(4000)
    finally:
        LocalEngine(settings).stop()  # the state file on this port names the process, even after a failed start
