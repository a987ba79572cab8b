"""What notebook 05 (quantization) needs beyond the floors below: which quantized configurations this engine
can serve, what the run says about each one's size, KV capacity, speed and quality against the baseline, the
checks of the format ladder and of the quantization map against the run, and the exercises' outcomes. What the
notebook uses from the floors is re-exported here (``__all__``), so its cells import from this module and
``helpers.engine.session`` only.

Speed is judged against the baseline's own run-to-run spread (the baseline is measured before and
after the variants: ``helpers.core.comparison``); quality by the eval's McNemar test (``helpers.evals.suite``).
Section 2's mechanism (one weight matrix quantized to FP8 and INT8 by hand) and its code exercise (the matrix's bytes
in INT4) have their helpers in ``helpers.lessons.l05_quantize_by_hand``; the tiny model's weights beside this CPU's
cache come from ``helpers.lessons.l04_cache_fit``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from helpers.core.comparison import BETTER, SAME, WORSE, compare_samples
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, report
from helpers.core.lesson import check_exercise, check_prediction, should_see, should_see_conclusion, show_solution
from helpers.core.models import by_profile, lesson_model, lesson_models, workshop_gpu
from helpers.core.settings import models_dir
from helpers.evals.scorecard import size_on_disk_mb
from helpers.hardware.machine import KV_DTYPE_FEATURE, capability, flag_skip_reason, model_feature
from helpers.lessons import plots
from helpers.lessons.l04_cache_fit import engine_cache_fit
from helpers.lessons.l05_quantize_by_hand import (INT4_HINT, checkpoint_tensor_bytes, int4_bytes_check, load_weight,
                                                  quantization_errors)
from helpers.measure.stream_timing import stream_chat
from helpers.planning.quant_formats import format_ladder, quantization_map
from helpers.planning.shape import REFERENCE_CONFIGS

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

__all__ = [  # this module's own, then what notebook 05 uses from the floors below
    "ANSWERS", "CORE", "GO_DEEPER",
    "KV_DTYPE_FEATURE", "PUBLISHED_FP8", "QuantizationStudy", "chosen_kernels", "conclusions", "decode_rate_tok_s",
    "eval_delta_outcome", "fp8_beside_gpu", "fraction_outcome", "growth_outcome", "kv_check", "kv_tokens_from_log",
    "ladder_check", "map_check", "map_disagreements", "planned_kv_tokens", "size_check", "skip_reason", "speed_conclusion",
    "startup_kv", "too_slow_reason",
    "REFERENCE_CONFIGS", "check_prediction", "format_ladder", "models_dir", "plots", "quantization_map", "report",
    "should_see", "should_see_conclusion", "size_on_disk_mb", "by_profile", "lesson_model", "lesson_models",
    "workshop_gpu", "check_exercise", "show_solution", "engine_cache_fit",
    "INT4_HINT", "checkpoint_tensor_bytes", "int4_bytes_check", "load_weight", "quantization_errors",  # by hand
]

BASELINE_NAME = "bf16 (baseline)"
CORE, GO_DEEPER = "core", "go deeper"  # the part of the notebook that measured a configuration

# issue 42: what gives each core-path check's answer away; tests/test_core_path.py fails if a phrase shows above it
ANSWERS: dict[str, tuple[str, ...]] = {
    "Write it yourself: the matrix's bytes in INT4": ("101,376", "two 4-bit weights per byte"),
    "Exercise 1: did quantization cost quality?": ("eval categories regressed beyond noise",),
    "Exercise 2: smaller weights, more KV cache": ("85,504 -> 110,128 KV tokens",),
}
# One published GPU figure for FP8 weights+activations, shown beside this run's CPU number, labelled as not from it.
PUBLISHED_FP8 = {
    "claim": "FP8 W8A8 allows up to a 1.6x improvement in throughput (and a 2x reduction in model memory) with "
             "minimal impact on accuracy, on GPUs such as NVIDIA H100 and AMD MI300x",
    "source": "vLLM docs, 'FP8 W8A8' (https://docs.vllm.ai/en/v0.32.0/features/quantization/llm_compressor/fp8/); "
              "the same sentence is in the v0.5.4 docs (https://docs.vllm.ai/en/v0.5.4/quantization/fp8.html) of "
              "August 2024 (v0.5.4: vllm-project/vllm pull request 7139, 2024-08-05); a vendor's upper bound with no "
              "setup given",
}


def skip_reason(profile: str, model_dir: Path | None = None, kv_cache_dtype: str | None = None) -> str | None:
    """None when this engine can serve the checkpoint / KV dtype; else the one sentence that says why not."""
    need = model_feature(model_dir) if model_dir is not None and model_dir.is_dir() else None
    found = capability(need, profile) if need else None
    if found is not None and not found.ok:
        return found.reason
    return flag_skip_reason("--kv-cache-dtype", kv_cache_dtype, profile) if kv_cache_dtype else None


def decode_rate_tok_s(lab: Lab, tokens: int = 32) -> float:
    """Single-stream generation rate (tokens/s) of what the engine serves now: one short forced-length request's
    tokens over its whole time, sent to done. Not the gaps between chunks: on a busy machine a stream's chunks can
    arrive bunched at its end (seen here: a 0.3 ms "TPOT" for the baseline, every variant then "300x slower"),
    while the request's duration cannot bunch; its short prefill is in every configuration's time alike."""
    timing = stream_chat(lab.client, lab.model, [{"role": "user", "content": "hi"}], max_tokens=tokens,
                         extra_body={"ignore_eos": True, "min_tokens": tokens})
    if not timing.ok or not timing.completion_tokens or timing.t_done is None or timing.t_done <= timing.t_sent:
        raise RuntimeError(f"the decode probe got no timing: {timing.error or 'no tokens'}")
    return timing.completion_tokens / (timing.t_done - timing.t_sent)


def kv_tokens_from_log(engine_log: str) -> int | None:
    """The KV-cache token slots the engine logged at start-up (its last "KV cache size: N tokens" line)."""
    found = re.findall(r"KV cache size: ([\d,]+) tokens", engine_log)
    return int(found[-1].replace(",", "")) if found else None


def startup_kv(lab: Lab) -> dict[str, Any]:
    """The KV capacity the engine serving now reported at start-up (``vllm:cache_config_info``; else its log):
    kv_capacity_tokens, num_gpu_blocks, block_size, cache_dtype, kv_cache_memory_bytes (None when not given)."""
    from helpers.evals.scorecard import kv_capacity_tokens
    from helpers.measure import server_metrics

    try:
        cache = server_metrics.scrape(lab.settings.metrics_url).cache_config() or {}
    except Exception:  # noqa: BLE001 - no metrics endpoint here: the log line is the fallback
        cache = {}
    tokens = kv_capacity_tokens(cache) or kv_tokens_from_log(lab.engine.logs(2000))
    return {"kv_capacity_tokens": tokens, **{k: cache.get(k) for k in
                                             ("num_gpu_blocks", "block_size", "cache_dtype", "kv_cache_memory_bytes")}}


def chosen_kernels(engine_log: str) -> list[str]:
    """The linear-layer kernels vLLM says it selected ("Selected X for Y"), from the engine's log."""
    return list(dict.fromkeys(re.findall(r"Selected (\w+Kernel) for", engine_log)))


def too_slow_reason(rate_tok_s: float, baseline_rate_tok_s: float, baseline_measure_s: float, max_measure_s: float,
                    kernels: Sequence[str] = ()) -> str | None:
    """None when the configuration's eval and load test fit in ``max_measure_s`` (estimated from the
    baseline's measure time scaled by the decode rates); otherwise the sentence that says why it is skipped."""
    estimate_s = baseline_measure_s * baseline_rate_tok_s / rate_tok_s
    if estimate_s <= max_measure_s:
        return None
    kernel = f" (vLLM chose {', '.join(kernels)} for its linear layers)" if kernels else ""
    return (f"Served, but it decodes {rate_tok_s:.1f} tokens/s against the baseline's {baseline_rate_tok_s:.0f} "
            f"({baseline_rate_tok_s / rate_tok_s:.0f}x slower){kernel}: the same eval and load test would take about "
            f"{estimate_s / 60:.0f} min, more than MAX_MEASURE_S ({max_measure_s:.0f} s), so it is not measured here. "
            f"On a CPU without a native kernel for this format the weights go through a generic path; on a GPU with "
            f"tensor cores for it (FP8: Ada, Hopper, Blackwell) the same checkpoint decodes at least as fast as BF16.")


def conclusions(rows: Sequence[Mapping[str, Any]], baseline_speeds: Sequence[float], speed_column: str,
                regressed: Mapping[str, list[str]], skipped: Mapping[str, str], profile: str,
                startup: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """One line per configuration (rows[0] is the baseline), then what the run shows overall.

    ``baseline_speeds``: the baseline's ``speed_column`` in each of its runs (their spread is the noise);
    ``regressed``: config -> eval categories that regressed beyond noise; ``skipped``: name -> reason;
    ``startup``: name -> the KV capacity the engine reported at start-up (``startup_kv``), for what was served
    but skipped as too slow to measure."""
    base = rows[0]
    lines = [f"- {base['config']}: {_size(base)}KV capacity {_tokens(base)} tokens; {speed_column} "
             f"{_mean(baseline_speeds):.0f} tok/s over {len(baseline_speeds)} run(s); eval {_eval(base)}."]
    faster, slower, same, kv_grown = [], [], [], []
    for row in rows[1:]:
        verdict = compare_samples(baseline_speeds, [row[speed_column]])
        {BETTER: faster, WORSE: slower, SAME: same}.get(verdict.label, []).append(row["config"])
        size = ""
        if row.get("size_on_disk_mb") and base.get("size_on_disk_mb"):
            size = f"{row['size_on_disk_mb']:.1f} MB on disk ({row['size_on_disk_mb'] / base['size_on_disk_mb']:.2f}x), "
        kv_ratio = (row["kv_capacity_tokens"] / base["kv_capacity_tokens"]
                    if row.get("kv_capacity_tokens") and base.get("kv_capacity_tokens") else None)
        if kv_ratio and kv_ratio > 1:
            kv_grown.append((row["config"], kv_ratio))
        quality = (f"regressed in {', '.join(regressed[row['config']])}" if regressed.get(row["config"])
                   else "no regression beyond noise")
        lines.append(f"- {row['config']}: {size}KV capacity {_tokens(row)} tokens"
                     f"{f' ({kv_ratio:.2f}x)' if kv_ratio and kv_ratio != 1 else ''}; speed {verdict.describe()}: "
                     f"{verdict.label}; eval {_eval(row)}: {quality}.")
    base_tokens = (startup or {}).get(base["config"], {}).get("kv_capacity_tokens") or base.get("kv_capacity_tokens")
    for name, reason in skipped.items():
        tokens = (startup or {}).get(name, {}).get("kv_capacity_tokens")
        ratio = tokens / base_tokens if tokens and base_tokens else None
        if ratio and ratio > 1 and name not in dict(kv_grown):
            kv_grown.append((name, ratio))
        at_start = f" At start-up it reported a KV capacity of {tokens:,} tokens ({ratio:.2f}x)." if ratio else ""
        lines.append(f"- {name}: skipped. {reason}{at_start}")
    lines += _overall(faster, slower, same, kv_grown, profile)
    return lines


def _overall(faster: list[str], slower: list[str], same: list[str], kv_grown: list[tuple[str, float]],
             profile: str) -> list[str]:
    out: list[str] = []
    expectation = "fewer bits per weight decode faster"
    if faster:
        out.append(str(Conclusion(f"Faster than the baseline beyond its noise: {', '.join(faster)}.", SHOWN,
                                  expectation)))
    if not faster and (same or slower):
        out.append(str(Conclusion(
                   "No configuration was measurably faster than the baseline here"
                   + (f" ({', '.join(slower)} slower)" if slower else "") + "."
                   + (" The tiny model's weights are megabytes, not gigabytes (section 5 printed them beside this "
                      "CPU's cache), so a decode step can be set by fixed per-step costs rather than bytes read, and "
                      "the CPU kernels convert quantized weights on the fly. "
                      "On a GPU serving a model of billions of parameters, decode is memory-bound: fewer bytes per "
                      "weight means fewer bytes read per token, which is where the speed-up comes from (an expectation, "
                      "not measured here)." if profile == "cpu" else ""),
                   NOT_SHOWN if slower and not same else WITHIN_NOISE, expectation)))
    for name, ratio in kv_grown:
        out.append(f"- {name} holds {ratio:.2f}x the baseline's KV tokens in the same KV memory.")
    if profile == "cpu":
        out.append("- On the CPU profile the KV memory is fixed by --kv-cache-memory-bytes, so smaller weights do not "
                   "grow it; on a GPU, what --gpu-memory-utilization leaves after the weights becomes KV cache, so every "
                   "byte the weights shed is room for more tokens (notebook 02 computes how much).")
    return out


def _mean(values: Sequence[float]) -> float:
    values = [v for v in values if v == v]
    return sum(values) / len(values) if values else float("nan")


def _size(row: Mapping[str, Any]) -> str:
    return f"{row['size_on_disk_mb']:.1f} MB on disk, " if row.get("size_on_disk_mb") else ""


def _tokens(row: Mapping[str, Any]) -> str:
    value = row.get("kv_capacity_tokens")
    return f"{int(value):,}" if value is not None and value == value else "unknown"


def _eval(row: Mapping[str, Any]) -> str:
    return f"{row['all_pass_rate']:.1%} (95% CI {row['all_ci_low']:.1%}-{row['all_ci_high']:.1%})"


# ---------------------------------------------------------------- notebook 05's measurements, step by step

class QuantizationStudy:
    """Notebook 05's run: the same eval and load test for the baseline, each quantized checkpoint and each
    online option, one scorecard row each; what was skipped and why; the eval comparisons with the baseline."""

    def __init__(self, lab: Lab, baseline: str, eval_suite: str, concurrencies: Sequence[int], input_len: int,
                 output_len: int, num_requests: int, max_measure_s: float) -> None:
        from helpers.evals.scorecard import Scorecard

        self.lab, self.baseline, self.eval_suite = lab, baseline, eval_suite
        self.concurrencies, self.input_len, self.output_len = list(concurrencies), input_len, output_len
        self.num_requests, self.max_measure_s = num_requests, max_measure_s
        self.card, self.skipped, self.comparisons = Scorecard(), {}, {}
        self.startup: dict[str, dict[str, Any]] = {}  # name -> KV capacity the engine reported at start-up
        self.too_slow_names: list[str] = []  # served, probed, not measured (too slow here)
        self.baseline_runs: list[float] = []
        self.speed = f"c{self.concurrencies[-1]}_output_tok_s"
        self.profile = lab.settings.profile
        self.baseline_config = lab.engine.config()
        self.baseline_run: Any = None
        self.baseline_rate_tok_s = self.baseline_measure_s = 0.0
        self.part = CORE  # the part of the notebook measuring now (``measure_flags(..., part=GO_DEEPER)``)
        self.parts: dict[str, str] = {}  # configuration -> the part that measured or skipped it

    @property
    def regressed(self) -> dict[str, list[str]]:
        """Configuration -> eval categories that regressed beyond noise against the baseline."""
        return {name: c.regressed for name, c in self.comparisons.items()}

    def describe(self) -> None:
        """Print the engine's flags, the machine and whether it is quiet."""
        from helpers.hardware.machine import check_quiet, describe

        print("engine flags:", " ".join(self.lab.engine.args()) or "(set where the engine runs)")
        machine = describe()
        print(f"CPU: {machine['cpu']}, {machine['cores']} cores, {machine['isa']}" if self.profile == "cpu"
              else f"engine: {self.profile} profile at {self.lab.settings.base_url}")
        print(check_quiet(self.lab).message())

    def measure(self, name: str, model: str) -> tuple[dict[str, Any], Any]:
        """Same eval and same load test for whatever the engine serves now: one scorecard row and the eval run."""
        from helpers.evals.suite import run_suite
        from helpers.evals.scorecard import measure_config
        from helpers.core.settings import models_dir

        self.parts[name] = self.part
        run = run_suite(self.lab, self.eval_suite)
        path = models_dir() / model
        row = measure_config(self.lab, name, self.concurrencies, self.input_len, self.output_len, self.num_requests,
                             evals_run=run, model_dir=path if path.is_dir() else None)
        return self.card.add(row), run

    def skip(self, name: str, reason: str | None) -> bool:
        """Record and print why a configuration is not measured; False when there is no reason."""
        if reason:
            self.skipped[name] = reason
            self.parts[name] = self.part
            print(f"{name}: skipped. {reason}")
        return bool(reason)

    def too_slow(self, name: str) -> bool:
        """Probe what the engine serves now: skip it when its eval and load test would exceed max_measure_s."""
        slow = self.skip(name, too_slow_reason(decode_rate_tok_s(self.lab), self.baseline_rate_tok_s,
                                               self.baseline_measure_s, self.max_measure_s,
                                               chosen_kernels(self.lab.engine.logs(1000))))
        if slow:
            self.too_slow_names.append(name)
        return slow

    def measure_baseline(self) -> dict[str, Any]:
        """The baseline's row (the engine switched to the baseline model first); its eval run is kept."""
        import time

        if self.lab.model != self.baseline:
            self.lab.engine.switch_model(self.baseline)
        self.baseline_config = self.lab.engine.config()  # what every step goes back to
        self.startup[BASELINE_NAME] = startup_kv(self.lab)
        started = time.monotonic()
        row, self.baseline_run = self.measure(BASELINE_NAME, self.baseline)
        self.baseline_measure_s, self.baseline_rate_tok_s = time.monotonic() - started, decode_rate_tok_s(self.lab)
        self.baseline_runs.append(row[self.speed])
        print(f"baseline measured in {self.baseline_measure_s:.0f} s; single-stream decode "
              f"{self.baseline_rate_tok_s:.0f} tokens/s")
        return row

    def _judge(self, name: str, run: Any) -> None:
        from helpers.evals.suite import compare

        self.comparisons[name] = compare(self.baseline_run, run)
        regressed = ", ".join(self.comparisons[name].regressed) or "none"
        print(f"{name}: eval categories regressed beyond noise: {regressed}")

    def measure_checkpoints(self, models: Sequence[str], restore: bool = True) -> None:
        """Each quantized checkpoint this engine can serve: switch, same eval and load test; the engine goes
        back to the baseline afterwards, whatever happens (``restore=False``: only on a failure, when the next step,
        ``measure_flags``, restarts on the baseline's configuration anyway, which saves a restart)."""
        from helpers.engine.interface import EngineStartError
        from helpers.core.settings import models_dir

        try:
            for model in models:
                name = model.removeprefix(self.baseline + "-") or model
                if self.skip(name, skip_reason(self.profile, models_dir() / model)):
                    continue
                try:
                    self.lab.engine.switch_model(model)
                except EngineStartError as err:  # started but could not serve here: the engine rolled back
                    self.skip(name, f"The engine could not serve it: {str(err).splitlines()[0]}")
                    continue
                if not self.too_slow(name):
                    self._judge(name, self.measure(name, model)[1])
        except BaseException:
            restore = True
            raise
        finally:
            if restore and self.lab.engine.config() != self.baseline_config:
                self.lab.engine.apply(self.baseline_config)

    def measure_flags(self, flags: Sequence[tuple[str, str | None, str]], part: str = CORE) -> None:
        """Each (flag, value, name) on the baseline model, one after the other (one restart each: the next
        flag replaces the last), then the baseline restored, whatever happens; a value None is left out. ``part``:
        the notebook's part that asks (``GO_DEEPER``: its lines go to ``conclusions(GO_DEEPER)``, not the core's)."""
        from dataclasses import replace

        from helpers.engine.interface import EngineStartError
        from helpers.core.vllm_args import with_flag

        base, self.part = self.baseline_config, part
        try:
            for flag, value, name in flags:
                if value is None:
                    continue
                if self.skip(name, skip_reason(self.profile,
                                               kv_cache_dtype=value if flag == "--kv-cache-dtype" else None)):
                    continue
                try:
                    self.lab.engine.apply(replace(base, args=with_flag(base.args, flag, value)))
                except EngineStartError as err:  # vLLM refused it here: the engine is back on the last good one
                    self.skip(name, f"vLLM refused it here: {str(err).splitlines()[0]}")
                    continue
                self.startup[name] = startup_kv(self.lab)  # read in seconds, before any load test
                if not self.too_slow(name):
                    self._judge(name, self.measure(name, self.baseline)[1])
        finally:
            self.part = CORE
            if self.lab.engine.config() != base:
                self.lab.engine.apply(base)

    def measure_baseline_again(self) -> None:
        """The baseline once more (after the variants): its spread against the first run is the noise."""
        self.measure("bf16 (baseline, again)", self.baseline)
        self.baseline_runs.append(self.card.rows.pop()[self.speed])

    def table(self) -> Any:
        """The scorecard: one row per measured configuration, the baseline first."""
        return self.card.frame().reset_index()

    def conclusions(self, part: str = CORE) -> list[str]:
        """Notebook 05's lines (``conclusions``) on this run's numbers, for the configurations one ``part`` of the
        notebook measured or skipped (``CORE`` or ``GO_DEEPER``), each against the baseline."""
        names = {name for name, where in self.parts.items() if where == part}
        if part != CORE and not names:
            return [f"- {part}: no configuration was measured or skipped in this run (RUN_GO_DEEPER is off, or its "
                    "option is None)."]
        rows = self.table().to_dict("records")
        return conclusions(rows[:1] + [r for r in rows[1:] if r["config"] in names], self.baseline_runs, self.speed,
                           self.regressed, {k: v for k, v in self.skipped.items() if k in names}, self.profile,
                           self.startup)


def size_check(rows: Sequence[Mapping[str, Any]]) -> tuple[bool | None, str]:
    """Is every quantized checkpoint smaller on disk than the baseline (rows[0])? (seen, the sizes in MB);
    None when no checkpoint with a size was measured."""
    base = rows[0].get("size_on_disk_mb") if rows else None
    sized = [(r["config"], r["size_on_disk_mb"]) for r in rows[1:] if r.get("size_on_disk_mb")]
    if rows and not base:  # an engine elsewhere (gpu, k8s) reads hub ids from its own volume, not from here: no
        # size is known whether or not a checkpoint was measured (one too slow on the CPU double's pod, say)
        return None, ("the checkpoints' files are not on this machine (the engine reads them from its own model "
                      "volume), so their sizes on disk are not known here")
    if not base or not sized:
        return None, "no quantized checkpoint was measured in this run"
    detail = ", ".join(f"{name} {mb:.1f} MB ({mb / base:.2f}x)" for name, mb in sized)
    return all(mb < base for _, mb in sized), f"baseline {base:.1f} MB; {detail}"


def kv_check(startup: Mapping[str, Mapping[str, Any]], name: str, skipped: Mapping[str, str],
             baseline: str = BASELINE_NAME) -> tuple[bool | None, str]:
    """Did configuration ``name`` (an FP8 KV cache) hold twice the baseline's KV tokens in the same KV memory, as the
    engine reported at start-up (``startup``: name -> ``startup_kv``)? None when it never started or the KV memory
    differs; no load test needed."""
    base, row = startup.get(baseline, {}), startup.get(name, {})
    if not row.get("kv_capacity_tokens") or not base.get("kv_capacity_tokens"):
        return None, f"{name} not started: {skipped.get(name, 'left out by the parameters')}"
    if base.get("kv_cache_memory_bytes") != row.get("kv_cache_memory_bytes"):
        return None, (f"not comparable: the KV memory differs ({base.get('kv_cache_memory_bytes')} vs "
                      f"{row.get('kv_cache_memory_bytes')} bytes)")
    ratio = row["kv_capacity_tokens"] / base["kv_capacity_tokens"]
    memory = (f"{base['kv_cache_memory_bytes'] / 2**30:g} GiB of" if base.get("kv_cache_memory_bytes") else "the same")
    blocks = (f"; {base['num_gpu_blocks']:,} -> {row['num_gpu_blocks']:,} blocks of {row.get('block_size')} tokens"
              if base.get("num_gpu_blocks") and row.get("num_gpu_blocks") else "")
    return abs(ratio - 2) < 0.05, (f"{base['kv_capacity_tokens']:,} -> {row['kv_capacity_tokens']:,} KV tokens "
                                   f"({ratio:.2f}x{blocks}) in {memory} KV memory, {base.get('cache_dtype') or 'auto'} "
                                   f"-> {row.get('cache_dtype') or name}, as the engine reported at start-up")


def eval_delta_outcome(comparison: Any) -> tuple[str, str]:
    """'lower', 'about the same' or 'higher' for a variant's overall eval pass rate against the baseline's (a
    change counts only when McNemar's p < 0.05 on the tasks that flipped), with the numbers."""
    row = comparison.table.loc["all"]
    diff, p = row["diff"], row.get("p_value")
    significant = p is not None and p == p and p < comparison.alpha
    outcome = "about the same" if not significant or not diff else ("lower" if diff < 0 else "higher")
    p_text = f"McNemar p = {p:.3f}" if p is not None and p == p else "unpaired runs"
    return outcome, (f"pass rate {row['rate_a']:.1%} -> {row['rate_b']:.1%} ({diff:+.1%}); {p_text}, "
                     f"{int(row.get('pass_to_fail') or 0)} task(s) pass->fail, {int(row.get('fail_to_pass') or 0)} fail->pass")


def fraction_outcome(ratio: float) -> str:
    """'under 1/3', '1/3 to 2/3' or 'over 2/3' for a ratio."""
    return "under 1/3" if ratio < 1 / 3 else "1/3 to 2/3" if ratio <= 2 / 3 else "over 2/3"


def speed_conclusion(rows: Sequence[Mapping[str, Any]], baseline_speeds: Sequence[float], speed_column: str) -> Conclusion:
    """Was any configuration (rows[1:]) faster than the baseline beyond the baseline's own spread?"""
    labels = {r["config"]: compare_samples(baseline_speeds, [r[speed_column]]).label for r in rows[1:]}
    faster = [n for n, label in labels.items() if label == BETTER]
    slower = [n for n, label in labels.items() if label == WORSE]
    if faster:
        return Conclusion(f"faster than the baseline beyond its noise: {', '.join(faster)}", SHOWN)
    if not labels:
        return Conclusion("no quantized configuration was measured in this run", WITHIN_NOISE)
    return Conclusion(f"none faster beyond the baseline's run-to-run spread ({len(baseline_speeds)} baseline runs)"
                      + (f"; slower: {', '.join(slower)}" if slower else ""),
                      NOT_SHOWN if slower and len(slower) == len(labels) else WITHIN_NOISE)


def fp8_beside_gpu(rows: Sequence[Mapping[str, Any]], baseline_speeds: Sequence[float], speed_column: str,
                   skipped: Mapping[str, str], reference_config: str | Path, gpu: str) -> list[str]:
    """FP8 weights' speed three ways: this run's CPU number (each FP8 configuration against the baseline's mean, or
    why it was not measured), the roofline's batch-1 decode ceiling (bandwidth / weight bytes) for the model of
    ``reference_config`` on ``gpu`` in BF16 and FP8, and one published GPU figure (``PUBLISHED_FP8``)."""
    from helpers.hardware.gpus import get_gpu
    from helpers.planning.roofline import single_stream_tokens_per_s
    from helpers.planning.shape import count_params
    from helpers.planning.weights import weight_bytes

    base = _mean(baseline_speeds)
    lines = [f"- This run (measured here): {r['config']} {r[speed_column]:.0f} tok/s against the baseline's {base:.0f} "
             f"({r[speed_column] / base:.2f}x)" for r in rows[1:] if _is_fp8_weights(r["config"])]
    lines += [f"- This run: {name} not measured. {reason.split(':')[0]}." for name, reason in skipped.items()
              if _is_fp8_weights(name)]
    lines = lines or ["- This run: no configuration with FP8 weights was served (VARIANTS, ONLINE_QUANTIZATION)."]
    card, counts = get_gpu(gpu), count_params(Path(reference_config))
    bf16, fp8 = weight_bytes(counts, "bf16"), weight_bytes(counts, "fp8")
    ceiling_bf16, ceiling_fp8 = single_stream_tokens_per_s(card, bf16), single_stream_tokens_per_s(card, fp8)
    lines.append(f"- Roofline (computed, not measured): {Path(reference_config).stem} on {card.name} "
                 f"({card.bandwidth_gb_s:,.0f} GB/s) decodes one stream at most at {ceiling_bf16:.0f} tok/s in BF16 "
                 f"({bf16 / 1e9:.1f} GB of weights) and {ceiling_fp8:.0f} tok/s in FP8 ({fp8 / 1e9:.1f} GB): "
                 f"{ceiling_fp8 / ceiling_bf16:.2f}x, the bytes each step reads (embeddings stay BF16).")
    lines.append(f"- Published, not from this run: {PUBLISHED_FP8['claim']} ({PUBLISHED_FP8['source']}).")
    return lines


def _is_fp8_weights(name: str) -> bool:
    return "fp8" in name.lower() and not name.startswith("kv-cache")


def planned_kv_tokens(reference_config: str | Path, gpu: str, weight_dtype: str, kv_dtype: str = "bf16",
                      max_model_len: int = 8192) -> int:
    """KV-cache token slots the planner (``helpers.planning.memory.plan_memory``) gives the model of ``reference_config``
    on ``gpu`` with its weights in ``weight_dtype``."""
    from helpers.planning.memory import plan_memory

    plan = plan_memory(Path(reference_config), gpu=gpu, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                       max_model_len=max_model_len)
    if plan.kv_cache is None or plan.kv_cache.kv_cache_tokens <= 0:
        raise ValueError(f"{Path(reference_config).stem} in {weight_dtype} leaves no KV memory on {gpu}: pick a "
                         "bigger GPU or a smaller model")
    return plan.kv_cache.kv_cache_tokens


def growth_outcome(ratio: float) -> str:
    """'about the same (under 1.1x)', '1.1x to 2x' or 'over 2x' for a growth ratio."""
    return "about the same (under 1.1x)" if ratio < 1.1 else "1.1x to 2x" if ratio <= 2 else "over 2x"


# ---------------------------------------------------------------- the format ladder and the quantization map

def ladder_check(ladder: pd.DataFrame, fmt: str = "int4") -> tuple[bool, str]:
    """Does ``fmt`` shrink the model to between a quarter and a half of BF16 (its bits would give the quarter;
    the embeddings kept in BF16 pull it up)? (seen, the numbers)."""
    column = next(c for c in ladder.columns if c.endswith("_weights_GB"))
    sizes = ladder.set_index("format")[column]
    ratio = sizes[fmt] / sizes["bf16"]
    bits = float(ladder.set_index("format").loc[fmt, "bits_per_weight"])
    return 0.25 <= ratio <= 0.5, (f"{fmt}: {sizes[fmt]:.2f} GB against BF16's {sizes['bf16']:.2f} GB = {ratio:.2f}x "
                                  f"({bits:.2f}/16 = {bits / 16:.2f}x for the linear layers alone)")


def map_check(table: pd.DataFrame, profile: str) -> tuple[bool | None, str]:
    """The map's check: (the probe and the run agree, the rows where they do not); None on a profile whose engine runs
    elsewhere (gpu, k8s), where this machine's probe says nothing of the engine's."""
    if profile != "cpu":
        return None, (f"the engine runs on the {profile} profile, elsewhere: this machine's probe says nothing of it, "
                      "so there is nothing to agree with")
    disagree = map_disagreements(table)
    return not disagree, "; ".join(disagree) or "no row where they differ"


def map_disagreements(table: pd.DataFrame) -> list[str]:
    """Rows where the probe and this run disagree: measured although the probe said no, or skipped although
    it said yes (the docs or the probe are then out of date for this machine). A configuration served but too slow
    to measure ("served, not measured") is no disagreement either way: it was not measured."""
    out = []
    for _, r in table.iterrows():
        probe, run = str(r["this machine (probe)"]), str(r["this run"])
        if probe.startswith("no:") and run.startswith("measured"):
            out.append(f"{r['scheme']}: {run} although the probe said '{probe}'")
        elif probe.startswith("yes") and any(part.endswith("skipped") for part in run.split("; ")):
            out.append(f"{r['scheme']}: {run} although the probe said yes")
    return out
