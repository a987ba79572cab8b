"""Notebook 05's judgement: which quantized configurations this engine can serve, and what the run
says about each one's size, KV capacity, speed and quality against the baseline.

Speed is judged against the baseline's own run-to-run spread (the baseline is measured before and
after the variants: ``helpers.comparison``); quality by the eval's McNemar test (``helpers.evals``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from helpers.comparison import BETTER, SAME, WORSE, compare_samples
from helpers.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion
from helpers.machine import capability, model_feature
from helpers.stream_timing import stream_chat

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.session import Lab

KV_DTYPE_FEATURE = {"fp8": "fp8_kv_cache", "fp8_e4m3": "fp8_kv_cache", "fp8_e5m2": "fp8_kv_cache"}


def skip_reason(profile: str, model_dir: Path | None = None, kv_cache_dtype: str | None = None) -> str | None:
    """None when this engine can serve the checkpoint / KV dtype; else the one sentence that says why not."""
    needs = [model_feature(model_dir) if model_dir is not None and model_dir.is_dir() else None,
             KV_DTYPE_FEATURE.get(kv_cache_dtype or "")]
    for need in filter(None, needs):
        found = capability(need, profile)
        if not found.ok:
            return found.reason
    return None


def decode_rate_tok_s(lab: Lab, tokens: int = 16) -> float:
    """Single-stream decode rate (tokens/s) of what the engine serves now: one short forced-length request."""
    timing = stream_chat(lab.client, lab.model, [{"role": "user", "content": "hi"}], max_tokens=tokens,
                         extra_body={"ignore_eos": True, "min_tokens": tokens})
    if not timing.ok or not timing.tpot_s:
        raise RuntimeError(f"the decode probe got no timing: {timing.error or 'fewer than two tokens'}")
    return 1 / timing.tpot_s


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
                regressed: Mapping[str, list[str]], skipped: Mapping[str, str], profile: str) -> list[str]:
    """One line per configuration (rows[0] is the baseline), then what the run shows overall.

    ``baseline_speeds``: the baseline's ``speed_column`` in each of its runs (their spread is the noise);
    ``regressed``: config -> eval categories that regressed beyond noise; ``skipped``: name -> reason."""
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
    lines += [f"- {name}: skipped. {reason}" for name, reason in skipped.items()]
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
                   + (" The tiny model's weights (a few MB) sit in the CPU's caches, so a decode step is set by fixed "
                      "per-step costs rather than bytes read, and the CPU kernels convert quantized weights on the fly. "
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
