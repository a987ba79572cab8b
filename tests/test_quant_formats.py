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


def test_the_ladder_check_goes_both_ways():
    ladder = format_ladder(REFERENCE_CONFIGS / "Qwen3-4B.json")
    seen, detail = ladder_check(ladder)
    assert seen and "int4" in detail
    fake = pd.DataFrame([{"format": "bf16", "bits_per_weight": 16, "m_weights_GB": 10.0},
                         {"format": "int4", "bits_per_weight": 4.16, "m_weights_GB": 8.0}])
    assert not ladder_check(fake)[0]
