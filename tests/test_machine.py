"""The machine probe: CPU flags -> features, the forced kind, the quiet-machine check's judgement."""

from __future__ import annotations

import pytest

from helpers.hardware import machine
from helpers.hardware.forced_isa import engine_environment, torch_cpu_answers
from helpers.hardware.machine import CpuInfo, QuietReport, capability, force_flags, judge_quiet, model_feature
from helpers.core.settings import models_dir

AVX512_BOX = frozenset("fpu sse avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni amx_tile amx_bf16".split())
EPYC_AVX2 = frozenset("fpu sse avx avx2 fma sha_ni".split())


def cpu(flags: frozenset[str], arch: str = "x86_64", forced: str | None = None) -> CpuInfo:
    return CpuInfo(model="test CPU", arch=arch, cores=2, flags=flags, memory_bytes=24 << 30, forced=forced)


def test_parse_cpuinfo_reads_the_model_and_flags_of_the_first_processor():
    text = ("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma\n\n"
            "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma avx512f\n")
    assert machine.parse_cpuinfo(text) == ("AMD EPYC 7B13", frozenset({"fpu", "avx2", "fma"}))
    assert machine.parse_meminfo_bytes("MemTotal:       24576000 kB\nMemFree: 1 kB\n") == 24576000 * 1024


def test_the_isa_is_the_best_vector_set_the_flags_show():
    assert cpu(AVX512_BOX).isa == "AMX"
    assert cpu(AVX512_BOX - {"amx_tile", "amx_bf16"}).isa == "AVX-512"
    assert cpu(EPYC_AVX2).isa == "AVX2"
    assert cpu(frozenset({"asimd"}), arch="aarch64").isa == "aarch64"


def test_forcing_avx2_removes_every_avx512_and_amx_flag_and_keeps_the_rest():
    forced = force_flags(AVX512_BOX, "avx2")
    assert "avx2" in forced and "fma" in forced
    assert not any(f.startswith(("avx512", "amx")) for f in forced)
    assert "avx512f" in force_flags(EPYC_AVX2, "AVX-512") and "amx_tile" not in force_flags(AVX512_BOX, "avx512")
    with pytest.raises(machine.MachineError, match="use avx2, avx512 or amx"):
        force_flags(AVX512_BOX, "sse4")


def test_cpu_info_honours_the_forced_kind():
    info = machine.cpu_info({"WORKSHOP_CPU_ISA": "avx2"})
    assert info.isa == "AVX2" and info.forced == "avx2" and not info.has("avx512f")
    assert "forced by WORKSHOP_CPU_ISA=avx2" in machine.describe(info)["isa"]


def test_features_follow_the_flags_and_say_why_when_missing():
    for feature in ("fp8_kv_cache", "int4_weights"):
        assert capability(feature, cpu=cpu(AVX512_BOX)).ok
        missing = capability(feature, cpu=cpu(EPYC_AVX2))
        assert not missing.ok and "this CPU is AVX2" in missing.reason and "Elsewhere:" in missing.reason
    amx_only = cpu(EPYC_AVX2 | {"amx_tile"})  # FP8 KV takes AVX-512 or AMX; the int4 kernel needs AVX-512
    assert capability("fp8_kv_cache", cpu=amx_only).ok and not capability("int4_weights", cpu=amx_only).ok
    assert "(forced)" in capability("int4_weights", cpu=cpu(EPYC_AVX2, forced="avx2")).reason


def test_an_engine_elsewhere_is_not_judged_by_this_cpu():
    remote = capability("int4_weights", profile="k8s", cpu=cpu(EPYC_AVX2))
    assert remote.ok and "k8s profile" in remote.reason
    with pytest.raises(machine.MachineError, match="known: fp8_kv_cache"):
        capability("warp_drive", cpu=cpu(AVX512_BOX))


def test_a_flag_value_this_cpu_cannot_start_with_is_named_before_any_restart():
    avx2, avx512 = cpu(EPYC_AVX2), cpu(AVX512_BOX)
    for value in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert "this CPU is AVX2" in machine.flag_skip_reason("--kv-cache-dtype", value, cpu=avx2)
        assert machine.flag_skip_reason("--kv-cache-dtype", value, cpu=avx512) is None
    assert machine.flag_skip_reason("--kv-cache-dtype", "auto", cpu=avx2) is None  # BF16 KV runs everywhere
    assert machine.flag_skip_reason("--max-num-seqs", "fp8", cpu=avx2) is None  # only the flag that needs it
    assert machine.flag_skip_reason("--kv-cache-dtype", "fp8", "k8s", cpu=avx2) is None  # a GPU elsewhere


def test_the_shipped_checkpoints_say_which_need_the_int4_kernel():
    needs = {name: model_feature(models_dir() / name) for name in
             ("tiny-agent", "tiny-agent-fp8-dynamic", "tiny-agent-w8a8", "tiny-agent-w4a16", "tiny-agent-gptq-int4")}
    assert needs == {"tiny-agent": None, "tiny-agent-fp8-dynamic": None, "tiny-agent-w8a8": None,
                     "tiny-agent-w4a16": "int4_weights", "tiny-agent-gptq-int4": "int4_weights"}


def test_cpu_times_reads_idle_and_steal_from_proc_stat():
    total, idle, steal = machine.cpu_times("cpu  100 0 50 800 50 0 0 20 0 0\ncpu0 1 2 3\n")
    assert (total, idle, steal) == (1020.0, 850.0, 20.0)


def report(**overrides) -> QuietReport:
    values = dict(cores=2, busy_share=0.03, steal_share=0.0, load_1m=0.2, other_vllm=[], loop_lag_p99_ms=0.4,
                  sample_s=1.0)
    return judge_quiet(QuietReport(**(values | overrides)))


def test_a_quiet_machine_gets_one_line_and_a_busy_one_a_warning_per_finding():
    quiet = report()
    assert quiet.quiet and quiet.message().startswith("Machine check: quiet")
    busy = report(busy_share=0.7, steal_share=0.12, other_vllm=["pid 42: vllm serve"], loop_lag_p99_ms=30.0)
    assert not busy.quiet and len(busy.warnings) == 4
    text = busy.message()
    assert text.startswith("Machine check: BUSY") and text.count("WARNING:") == 4
    assert "70% of the CPU was busy" in text and "steal" in text and "pid 42" in text and "30.0 ms late" in text


def test_check_quiet_samples_this_machine():
    found = machine.check_quiet(sample_s=0.3)
    assert found.sample_s >= 0.29 and 0 <= found.busy_share <= 1 and found.cores >= 1
    assert found.quiet == (not found.warnings)


def test_forced_kind_reaches_the_engine_process_through_its_environment():
    assert engine_environment(None, {}) == {}
    env = engine_environment("avx2", {"PYTHONPATH": "/somewhere"})
    assert env["WORKSHOP_CPU_ISA"] == "avx2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["PYTHONPATH"].endswith(":/somewhere") and "forced_isa_site" in env["PYTHONPATH"]
    assert torch_cpu_answers("avx2") == {"_is_avx512_supported": False, "_is_avx512_bf16_supported": False,
                                         "_is_avx512_vnni_supported": False, "_is_amx_tile_supported": False,
                                         "_is_amx_fp16_supported": False}
    assert torch_cpu_answers("amx")["_is_amx_tile_supported"] is True
