"""Every weight format the planner knows has a native-hardware row with a source."""

from helpers.planning.weights import WEIGHT_FORMATS
from helpers.planning.quant_formats import NATIVE_HARDWARE


def test_every_weight_format_has_hardware_and_a_source():
    assert set(NATIVE_HARDWARE) == set(WEIGHT_FORMATS)
    for hardware, source in NATIVE_HARDWARE.values():
        assert hardware and len(source) > 10


# ---------------------------------------------------------------- the quantization map

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers.hardware.machine import cpu_info  # noqa: E402
from helpers.planning.shape import REFERENCE_CONFIGS  # noqa: E402
from helpers.planning.quant_formats import (format_ladder, gguf_bits_per_weight, installed_vllm_methods,  # noqa: E402
                                            machine_verdict, quantization_map, schemes)
from helpers.lessons.l05_quantization import ladder_check, map_disagreements  # noqa: E402


def test_gguf_block_layouts_give_llama_cpps_bits_per_weight():
    assert gguf_bits_per_weight(256, 4, 8 * 12 + 2 * 16) == 4.5   # Q4_K
    assert gguf_bits_per_weight(32, 8, 16) == 8.5                  # Q8_0: one FP16 scale per 32


def test_every_scheme_says_calibration_hardware_flag_and_source():
    rows = schemes()
    names = {s.name for s in rows}
    for wanted in ("W4A16 GPTQ", "W4A16 AWQ", "W8A8 INT8", "NVFP4", "MXFP4", "KV cache FP8"):
        assert wanted in names
    assert any(s.name.startswith("GGUF") for s in rows) and any("W8A16" in s.name for s in rows)
    for s in rows:
        assert s.calibration and s.hardware and s.vllm and len(s.source) > 10 and 4 <= s.bits <= 16
    calibrated = [s for s in rows if s.calibration.startswith("yes")]
    assert calibrated and all("risk" in s.calibration for s in calibrated if "GPTQ" in s.name or "AWQ" in s.name)


def test_the_installed_vllm_is_read_without_importing_it():
    found = installed_vllm_methods()
    assert found is not None, "vLLM is installed in the project's environment"
    version, methods = found
    assert version and "compressed-tensors" in methods and "fp8" in methods


@pytest.mark.parametrize("isa, int4, kv", [("avx2", "no", "no"), ("avx512", "yes", "yes")])
def test_this_machine_column_follows_the_probe(monkeypatch, isa, int4, kv):
    monkeypatch.setenv("WORKSHOP_CPU_ISA", isa)
    by_name = {s.name: s for s in schemes()}
    methods = ("0.0", ("compressed-tensors", "gptq", "awq", "fp8"))
    cpu = cpu_info()
    assert machine_verdict(by_name["W4A16 GPTQ"], "cpu", methods, cpu).startswith(int4)
    assert machine_verdict(by_name["KV cache FP8"], "cpu", methods, cpu).startswith(kv)
    assert machine_verdict(by_name["NVFP4"], "cpu", methods, cpu).startswith("no: this vLLM (0.0) has no")
    assert machine_verdict(by_name["W8A8 INT8"], "cpu", methods, cpu).startswith("yes")
    assert machine_verdict(by_name["FP8 W8A8, static scales"], "cpu", methods, cpu).startswith("no: vLLM's CPU build")
    assert machine_verdict(by_name["NVFP4"], "gpu", methods, cpu).startswith("not probed")


def test_the_map_marks_what_the_run_measured_and_flags_disagreements(monkeypatch):
    monkeypatch.setenv("WORKSHOP_CPU_ISA", "avx2")
    table = quantization_map("cpu", measured=["bf16 (baseline)", "w8a8", "online fp8_per_channel"],
                             skipped={"w4a16": "This step needs AVX-512."})
    run = table.set_index("scheme")["this run"]
    assert run["W8A8 INT8"] == "measured: w8a8" and run["W4A16 round-to-nearest"] == "w4a16 skipped"
    assert run["NVFP4"] == "-"
    disagree = map_disagreements(table)
    assert len(disagree) == 1 and disagree[0].startswith("FP8 W8A8, dynamic scales: measured")
    monkeypatch.setenv("WORKSHOP_CPU_ISA", "avx512")
    again = quantization_map("cpu", measured=["bf16 (baseline)"], skipped={"w4a16": "the engine could not serve it"})
    assert any(d.startswith("W4A16 round-to-nearest: w4a16 skipped although the probe said yes")
               for d in map_disagreements(again))


def test_a_configuration_too_slow_to_measure_reads_not_measured_and_agrees_with_the_probe(monkeypatch):
    monkeypatch.setenv("WORKSHOP_CPU_ISA", "amx")
    slow = {"online fp8_per_channel": "Served, but it decodes 11.0 tokens/s", "kv-cache fp8": "Served, but slow"}
    table = quantization_map("cpu", measured=["bf16 (baseline)"], skipped=slow,
                             too_slow=["online fp8_per_channel", "kv-cache fp8"])
    run = table.set_index("scheme")["this run"]
    assert run["KV cache FP8"] == "kv-cache fp8 served, not measured (too slow here)"
    assert not [d for d in map_disagreements(table) if d.startswith(("KV cache FP8", "FP8 W8A8, dynamic"))]
    # the same skip for another reason is a disagreement with a probe that said yes
    table = quantization_map("cpu", measured=["bf16 (baseline)"],
                             skipped={"kv-cache fp8": "the engine could not serve it"})
    assert any(d.startswith("KV cache FP8: kv-cache fp8 skipped although the probe said yes")
               for d in map_disagreements(table))


def test_the_ladder_check_goes_both_ways():
    ladder = format_ladder(REFERENCE_CONFIGS / "Qwen3-4B.json")
    seen, detail = ladder_check(ladder)
    assert seen and "int4" in detail
    fake = pd.DataFrame([{"format": "bf16", "bits_per_weight": 16, "m_weights_GB": 10.0},
                         {"format": "int4", "bits_per_weight": 4.16, "m_weights_GB": 8.0}])
    assert not ladder_check(fake)[0]


# ---------------------------------------------------------------- the map's flags against the installed vLLM

import ast  # noqa: E402
import importlib.util  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402


def online_shorthands() -> dict[str, set[str]]:
    """The installed vLLM's ``--quantization`` shorthands -> the layer kinds each quantizes ("linear": dense layers,
    "moe": experts), read from ``_ONLINE_SHORTHANDS`` in vllm/config/quantization.py without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vLLM is installed in the project's environment"
    source = Path(next(iter(spec.submodule_search_locations))) / "config" / "quantization.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_ONLINE_SHORTHANDS":
            return {key.value: {kw.arg for kw in call.keywords if kw.arg in ("linear", "moe")}
                    for key, call in zip(node.value.keys, node.value.values)}
    raise AssertionError(f"no _ONLINE_SHORTHANDS in {source}: read the new vLLM's online quantization and update this")


def quantization_flags(text: str) -> list[str]:
    """Every value the text gives ``--quantization``."""
    return re.findall(r"--quantization\s+([\w-]+)", text)


def test_every_quantization_flag_the_map_names_is_an_online_scheme_of_the_installed_vllm():
    version, methods = installed_vllm_methods()
    shorthands = online_shorthands()
    assert {"fp8_per_tensor", "fp8_per_channel", "int8_per_channel_weight_only"} <= set(shorthands)
    rows = {s.name: s.vllm for s in schemes()}
    named = [(name, flag) for name, text in rows.items() for flag in quantization_flags(text)]
    assert named, "the map names vLLM's online (--quantization) schemes"
    for name, flag in named:
        assert flag in methods, f"{name}: vLLM {version} has no --quantization {flag}"
        # quantizing a BF16 checkpoint at load time takes an online scheme (plain fp8 is deprecated for that)
        assert flag in shorthands, \
            f"{name}: --quantization {flag} is not one of vLLM's online schemes {sorted(shorthands)}"
        if "linear" not in shorthands[flag]:
            assert "MoE" in rows[name] and "dense" in rows[name], \
                f"{name}: --quantization {flag} leaves dense layers unquantized; the row must say so"
    assert quantization_flags("--quantization fp8 at load time, or --quantization fp8_per_block") == [
        "fp8", "fp8_per_block"]
    assert "fp8" not in shorthands  # what the row used to say: not an online scheme of this vLLM


def test_the_w8a16_row_names_what_quantizes_a_dense_models_layers():
    shorthands = online_shorthands()
    w8a16 = next(s for s in schemes() if "W8A16" in s.name)
    # vLLM's online INT8 weight-only scheme sets a MoE spec and no linear one: a dense model stays BF16
    assert shorthands["int8_per_channel_weight_only"] == {"moe"}
    dense_flags = [f for f in quantization_flags(w8a16.vllm) if "linear" in shorthands.get(f, set())]
    assert w8a16.vllm_method == "compressed-tensors" or dense_flags, \
        f"{w8a16.name}: neither a checkpoint method nor an online scheme that quantizes linear layers"
    assert w8a16.vllm.startswith("the checkpoint's quantization_config (compressed-tensors W8A16)")
    verdict = machine_verdict(w8a16, "cpu", installed_vllm_methods())
    assert verdict.startswith("no: vLLM's CPU build has no 8-bit weight-only kernel")
