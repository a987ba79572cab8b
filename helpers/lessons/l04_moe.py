"""What notebook 04 (dense vs mixture-of-experts) needs beyond the floors below: the published models on paper,
the decode speed of two tiny sibling models on the live engine, and what the numbers do and do not say about MoE
on a GPU. What the notebook uses from the floors is re-exported here (``__all__``), so its cells import from this
module and ``helpers.engine.session`` only.

``measure_decode`` serves each model in turn (``rounds`` > 1 alternates them, each switch restarts the
engine) and measures every batch size ``repeats`` times, keeping each run. ``conclude_dense_vs_moe``
judges the MoE against the dense model at each batch against the repeats' spread, and calls a gap no
model difference can explain implausible. ``moe_gpu_caveat`` is the labelled GPU statement; ``moe_roofline_table``
and ``moe_beside_gpu`` put this run's CPU number beside the roofline of a GPU and one published GPU measurement
(``PUBLISHED_MOE``), labelled as not from this run. ``fits_lines`` says, from the numbers, which model's BF16 weights
fit the workshop GPU; ``moe_ceiling_check`` checks the code exercise (the MoE's batch-1 decode ceiling, written by the
attendee). The thinking step is ``helpers.lessons.l04_thinking``; the tiny models against this CPU's caches,
``helpers.lessons.l04_cache_fit``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import pandas as pd

from helpers.core.comparison import BETTER, SAME, UNKNOWN, compare_samples, interleave
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, report
from helpers.core.models import by_profile, lesson_model, missing_reason, workshop_gpu
from helpers.core.settings import models_dir
from helpers.core.lesson import (check_exercise, check_prediction, ratio_outcome, should_see, should_see_conclusion,
                                 show_conclusions, show_solution)
from helpers.hardware.gpus import get_gpu
from helpers.hardware.machine import check_quiet
from helpers.lessons.l04_cache_fit import (conclude_cache_fit, engine_cache_fit, last_level_cache, model_config,
                                           served_weight_bytes)
from helpers.lessons.l04_thinking import (api_price, conclude_thinking_cost, engine_price, measure_thinking,
                                          per_token_outcome, thinking_example, thinking_model_served, thinking_table)
from helpers.planning import roofline
from helpers.planning.shape import REFERENCE_CONFIGS, count_params
from helpers.planning.weights import weight_bytes

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

__all__ = [  # this module's own, then what notebook 04 uses from the floors below
    "IMPLAUSIBLE_RATIO", "NOISY_REL", "conclude_dense_vs_moe", "conclude_moe_on_paper", "conclude_roofline_fit",
    "decode_table", "experts_share_outcome", "fade_table", "measure_decode", "moe_gpu_caveat", "paper_table",
    "plot_tiny_decode", "tiny_roofline_points", "PUBLISHED_MOE", "moe_roofline_table", "moe_beside_gpu",
    "fits_lines", "MOE_CEILING_HINT", "moe_ceiling_check", "ceiling_key", "CEILING_RATIO_CHOICES",
    "ceiling_ratio_outcome", "ANSWERS",
    "conclude_cache_fit", "engine_cache_fit", "last_level_cache", "served_weight_bytes",  # l04_cache_fit
    "api_price", "conclude_thinking_cost", "engine_price", "measure_thinking", "per_token_outcome",  # l04_thinking
    "thinking_example", "thinking_model_served", "thinking_table",
    "Conclusion", "REFERENCE_CONFIGS", "check_exercise", "show_solution",
    "check_prediction", "check_quiet", "count_params",
    "get_gpu", "ratio_outcome", "report", "roofline", "should_see", "should_see_conclusion",
    "show_conclusions", "weight_bytes", "models_dir", "model_config", "engine_bandwidth_gb_s", "by_profile", "lesson_model", "workshop_gpu",
]

# issue 42: what gives each core-path check's answer away; tests/test_core_path.py fails if a phrase shows above it
ANSWERS: dict[str, tuple[str, ...]] = {
    "Write it yourself: the MoE's batch-1 ceiling": ("a step reads the active parameters once",),
    "Exercise 1: how many experts does a batch touch?": ("111.8 of 128 experts", "different tokens pick different ones",
                                                         "climb towards all E"),
    "Exercise 2: is a reasoning token dearer?": ("a reasoning token is decoded like any other",
                                                 "one more decode step"),
    "Exercise 3: a faster GPU": ("the ratio of bytes read", "whatever the GPU"),
}

# The tiny MoE has the dense model's active MLP and 4x its MLP weights: per token it computes the same and
# reads more. A decode rate this many times the dense one is no model difference but a disturbed run.
IMPLAUSIBLE_RATIO = 1.5
# Runs of one model that differ by more than this (relative range) among themselves compare nothing.
NOISY_REL = 0.5
# One published GPU measurement of an MoE against a dense model at batch, shown beside this run's CPU number and the
# roofline, labelled as not from this run (read 2026-12-01).
PUBLISHED_MOE = {
    "claim": "DeepSeek-V2 (a mixture of experts: 236B parameters, 21B active per token) on one node of 8 H800 GPUs "
             "generates above 50K tokens/s, 5.76 times the maximum generation throughput of the dense DeepSeek 67B; "
             "it was served with FP8 weights and a KV cache of about 6 bits per element, which with its latent "
             "attention (MLA) let it run much larger batches, so the factor is not the experts' alone",
    "source": "DeepSeek-AI, 'DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model', "
              "arXiv 2405.04434 (May 2024), section 3.2.3 'Inference Efficiency'",
}


def engine_bandwidth_gb_s(lab: Lab, measured_here_gb_s: float, gpu: Any) -> float:
    """The memory bandwidth the engine's decode reads at, in GB/s: this machine's, measured, when the engine runs on
    its CPU (the cpu profile); the workshop GPU's datasheet figure when it runs on a GPU (gpu, k8s)."""
    if lab.settings.profile == "cpu":
        return measured_here_gb_s
    print(f"the engine runs on {gpu.name}: its roofline uses the datasheet's {gpu.bandwidth_gb_s:,.0f} GB/s, not this "
          "machine's")
    return gpu.bandwidth_gb_s


def measure_decode(lab: Lab, models: list[str | None], batches: list[int], input_len: int, output_len: int,
                   requests_per_stream: int, repeats: int, rounds: int, bandwidth_gb_s: float) -> pd.DataFrame:
    """One row per (model, batch, run): client throughput, the engine's own step time (from
    ``vllm:inter_token_latency_seconds``), decode tokens/s from it, and the roofline ceiling and MBU at
    ``bandwidth_gb_s``. ``models`` is [dense, MoE]; None for a model the room did not download, which is skipped
    with its sentence; an endpoint run elsewhere measures what it serves. On the cpu profile's local engine the other
    model starts once beside the baseline (``served_beside``) and stops after; elsewhere each switch is a restart, and
    the engine goes back to its model."""
    from helpers.engine.session import beside_config, beside_possible, served_beside
    from helpers.measure.bench_results import summarize
    from helpers.measure.loadgen import prompt_factory, run_load
    from helpers.measure.workloads import Load, Workload
    from helpers.planning.kv import kv_cache_bytes
    from helpers.measure.server_metrics import scrape, window

    baseline = lab.model
    if None in models:  # a role the room did not download (the MoE without components/with-moe)
        print(missing_reason("moe", lab.settings))
        models = [m for m in models if m is not None]
    if not lab.engine.reconfigurable:  # an endpoint run elsewhere: only what it serves
        served = lab.engine.served_models()
        kept = [m for m in models if m in served]
        if not kept:
            print(f"{lab.settings.base_url} serves {', '.join(served)}, none of {', '.join(models)}, and its model is "
                  f"set where it runs, so this measures {lab.model} alone (the local engine, unset VLLM_HOST, or the "
                  "cluster profile can switch models).")
            kept = [lab.model]
        elif len(kept) < len(models):
            print(f"measuring only {', '.join(kept)}: {lab.settings.base_url} is run elsewhere, so its model is set "
                  "where it runs (the local engine or the cluster profile can switch models)")
        models = kept

    point: Callable[[bool], None] | None = None  # the cpu profile: the other model beside the baseline

    def serve(name: str):
        def run() -> list[dict[str, Any]]:
            if point is not None:
                point(name != baseline)
            elif lab.model != name:
                lab.engine.switch_model(name)
            counts = count_params(model_config(name))
            kv_per_token = kv_cache_bytes(model_config(name)).bytes_per_token
            prompts = prompt_factory(lab.settings, lab.model)  # calibrated once per model, salted per run
            rows = []
            for b in batches:
                for repeat in range(max(1, repeats)):
                    before = scrape(lab.settings.metrics_url)
                    s = summarize(run_load(lab.settings, Workload(input_len=input_len, output_len=output_len),
                                           Load(concurrency=b, num_requests=b * requests_per_stream,
                                                warmup_requests=b if repeat == 0 else 0),
                                           model=lab.model, prompts=prompts))
                    step_s = window(before, scrape(lab.settings.metrics_url))["itl_mean_s"]
                    step_bytes = roofline.moe_bytes_per_step(counts, b) + b * (input_len + output_len // 2) * kv_per_token
                    rows.append({"model": name, "batch": b, "run": repeat, "total_params_M": counts.total / 1e6,
                                 "active_params_M": counts.active / 1e6, "MB_read_per_step": step_bytes / 1e6,
                                 "measured_tok_s": s["output_throughput"],
                                 "client_median_tpot_ms": s["median_tpot_ms"], "server_step_ms": step_s * 1000,
                                 "decode_tok_s": b / step_s,
                                 "roofline_ceiling_tok_s": b * bandwidth_gb_s * 1e9 / step_bytes,
                                 "mbu": roofline.mbu(step_bytes, step_s, bandwidth_gb_s)})
            return rows
        return run

    others = [m for m in models if m != baseline]
    with ExitStack() as stack:
        if beside_possible(lab) and len(others) == 1:  # one start, beside the baseline: the rounds alternate freely
            point = stack.enter_context(served_beside(lab, beside_config(lab.settings, others[0]), others[0]))
        try:
            results = interleave({name: serve(name) for name in models}, rounds,
                                 desc="models" if point else "models (each switch restarts)")
        finally:  # back to the workshop's model, whatever happened
            if point is None and lab.model != baseline:
                lab.engine.switch_model(baseline)
    return pd.DataFrame([row for runs in results.values() for rows in runs for row in rows])


def decode_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean of every figure per (model, batch) over the runs, with how many runs."""
    numeric = runs.drop(columns=["run"]).groupby(["model", "batch"], sort=False)
    return numeric.mean().assign(runs=numeric.size()).reset_index()


def conclude_dense_vs_moe(runs: pd.DataFrame, dense: str, moe: str | None, quiet: bool | None = None,
                          implausible_ratio: float = IMPLAUSIBLE_RATIO, noisy_rel: float = NOISY_REL) -> list[Conclusion]:
    """Per batch, the tiny MoE's decode rate (engine step time) against the dense model's.

    Expectation: the tiny MoE is no faster (same active MLP per token, more weights, routing on top, and
    fixed per-step costs dominate models this small). A ratio above ``implausible_ratio`` is called
    implausible, with the spread and the quiet-machine check as the reason to distrust it; runs of one
    model that differ by more than ``noisy_rel`` among themselves are too noisy to compare at all."""
    expectation = "the tiny MoE decodes no faster than the dense model"
    if moe is None:  # the room did not download one: section 3 said why
        return [Conclusion("not run: no MoE is served on this profile (section 3 said why), so the dense model's "
                           "decode rate is shown alone")]
    out = []
    for b in sorted(runs["batch"].unique()):
        a = runs[(runs.model == dense) & (runs.batch == b)]["decode_tok_s"].tolist()
        m = runs[(runs.model == moe) & (runs.batch == b)]["decode_tok_s"].tolist()
        if not a or not m:
            out.append(Conclusion(f"batch {b}: {dense if not a else moe} was not measured (see above), so there is "
                                  "nothing to compare.", NOT_SHOWN, expectation))
            continue
        v = compare_samples(a, m, higher_is_better=True)
        text = f"batch {b}: {moe} {v.mean_b:,.0f} tok/s vs {dense} {v.mean_a:,.0f} tok/s ({v.describe()})"
        if v.label != UNKNOWN and v.noise_rel > noisy_rel:
            busy = "; the machine was busy (quiet check)" if quiet is False else ""
            out.append(Conclusion(text + f": the runs of one model differ by +/-{v.noise_rel:.0%} among themselves{busy}, "
                                  "too noisy to compare the models at all; rerun on a quiet machine or with more REPEATS.",
                                  WITHIN_NOISE, expectation))
        elif v.label == SAME:
            out.append(Conclusion(text + ": no measurable difference; fixed per-step costs set both.", SHOWN, expectation))
        elif v.label != BETTER and v.shown:
            out.append(Conclusion(text + ": the MoE is slower, what routing (a top-k, a gather per expert) costs on "
                                  "top.", SHOWN, expectation))
        elif v.label == BETTER and v.ratio > implausible_ratio:
            busy = " and the machine was busy (quiet check)" if quiet is False else ""
            out.append(Conclusion(
                text + f": implausible. Per token the MoE computes what the dense model computes and reads more "
                "weights, so no model difference explains a gap this large: one of the runs was disturbed "
                f"(spread +/-{v.noise_rel:.0%}{busy}). Rerun with more REPEATS before reading anything into it.",
                NOT_SHOWN, expectation))
        elif v.label == BETTER:
            out.append(Conclusion(text + ": the MoE came out faster, by less than an implausible margin; with "
                                  f"{min(v.n_a, v.n_b)} run(s) each, read it as noise until more repeats agree.",
                                  WITHIN_NOISE, expectation))
        else:
            out.append(Conclusion(text + ": not measured.", NOT_SHOWN, expectation))
    return out


def conclude_roofline_fit(runs: pd.DataFrame, bandwidth_gb_s: float) -> Conclusion:
    """How far the tiny models stay below their bandwidth ceiling (MBU): fixed costs, not bytes, set their step."""
    table = decode_table(runs)
    top = table.loc[table["mbu"].idxmax()]
    text = (f"at {bandwidth_gb_s:.1f} GB/s measured, the best memory-bandwidth utilization was {top.mbu:.3f} "
            f"({top.model}, batch {top.batch}: {top.decode_tok_s:,.0f} tok/s vs a ceiling of "
            f"{top.roofline_ceiling_tok_s:,.0f})")
    expectation = "tiny models stay far below the bandwidth roofline"
    if top.mbu < 0.5:
        return Conclusion(text + ": a step's time is set by fixed costs (scheduling, kernel launches, the API "
                          "server), not by reading the weights.", SHOWN, expectation)
    return Conclusion(text + ": close to the roofline, so bytes read do set the step time on this machine.",
                      NOT_SHOWN, expectation)


def moe_gpu_caveat(dense: str, moe: str, dense_gb_per_step: float, moe_gb_per_step: float, gpu: str,
                   gpu_bandwidth_gb_s: float) -> Conclusion:
    """The labelled GPU statement: computed from published configs and a datasheet, not measured here."""
    return Conclusion(
        f"On a GPU (computed from the published configs and the datasheet, not measured here): at batch 1 {moe} reads "
        f"{moe_gb_per_step:.1f} GB per step against {dense_gb_per_step:.1f} GB for {dense}, so on {gpu} "
        f"({gpu_bandwidth_gb_s:,.0f} GB/s) its decode ceiling is {dense_gb_per_step / moe_gb_per_step:.1f}x the dense "
        "model's. There, reading the weights is most of a step, so the bandwidth argument holds; the tiny models "
        "here weigh megabytes (section 3 printed them beside this CPU's cache), so fixed per-step costs, not the bytes "
        "they read, can set their steps, which is why their comparison cannot show it.")


def conclude_moe_on_paper(dense: str, moe: str, paper: dict[str, dict[str, float]], batch: int,
                          distinct_experts: float, num_experts: int, moe_gb_at_batch: float) -> list[Conclusion]:
    """The on-paper lesson (published configs): total vs active parameters, and the advantage fading with the batch."""
    d, m = paper[dense], paper[moe]
    return [
        Conclusion(f"{moe}: {m['total_params_B']:.1f} B parameters in total but {m['active_params_B']:.1f} B active per "
                   f"token ({dense}: {d['total_params_B']:.1f} B); at batch 1 it reads {m['bytes_read_batch1_GB']:.1f} GB "
                   f"per step vs {d['bytes_read_batch1_GB']:.1f} GB for the dense model (computed from config.json)."),
        Conclusion(f"At batch {batch} a layer touches {distinct_experts:.0f} of {num_experts} experts: {moe_gb_at_batch:.1f} GB "
                   f"read per step against {m['bf16_weights_GB']:.1f} GB of weights in all, the MoE advantage in bytes "
                   f"{'mostly gone' if moe_gb_at_batch > 0.5 * m['bf16_weights_GB'] else 'still there'}."),
    ]


# ---------------------------------------------------------------------------------------------
# The paper models (published config.json files) and the tiny ones on the roofline


def paper_table(models: list[str], gpu: Any) -> dict[str, dict[str, float]]:
    """Per published model (``helpers/data/configs``): total and active parameters (B), experts, BF16 weights and
    bytes read per decode step at batch 1 (GB), and the batch-1 decode ceiling on ``gpu`` (tokens/s)."""
    paper = {}
    for name in models:
        counts = count_params(REFERENCE_CONFIGS / f"{name}.json")
        read = roofline.moe_bytes_per_step(counts, 1)
        paper[name] = {"total_params_B": counts.total / 1e9, "active_params_B": counts.active / 1e9,
                       "experts": counts.num_experts, "experts_per_token": counts.experts_per_token,
                       "bf16_weights_GB": weight_bytes(counts) / 1e9, "bytes_read_batch1_GB": read / 1e9,
                       ceiling_key(gpu): gpu.bandwidth_bytes_per_s / read}
    return paper


def ceiling_key(gpu: Any) -> str:
    """The name of ``paper_table``'s batch-1 decode ceiling on ``gpu`` (tokens/s), a row of the table as shown."""
    return f"decode_ceiling_batch1_tok_s_on_{gpu.name}"


def fade_table(dense: str, moe: str, batches: list[int]) -> pd.DataFrame:
    """Per batch: distinct experts one layer of ``moe`` touches, and GB read per decode step by each model."""
    moe_counts = count_params(REFERENCE_CONFIGS / f"{moe}.json")
    dense_gb = weight_bytes(count_params(REFERENCE_CONFIGS / f"{dense}.json")) / 1e9
    return pd.DataFrame([{"batch": b,
                          "distinct_experts_per_layer": roofline.expected_distinct_experts(
                              moe_counts.num_experts, moe_counts.experts_per_token, b),
                          f"{moe}_GB_read_per_step": roofline.moe_bytes_per_step(moe_counts, b) / 1e9,
                          f"{dense}_GB_read_per_step": dense_gb} for b in batches])


def tiny_roofline_points(tiny: pd.DataFrame, cpu: Any, input_len: int, output_len: int) -> list[Any]:
    """The measured tiny-model decode steps (``decode_table`` rows) as points on this machine's roofline."""
    from helpers.planning.kv import kv_cache_bytes

    points = []
    for _, r in tiny.iterrows():
        counts = count_params(model_config(r.model))
        bound = roofline.decode_bound(cpu, roofline.moe_bytes_per_step(counts, r.batch), counts.active, r.batch,
                                      input_len + output_len // 2, kv_cache_bytes(model_config(r.model)).bytes_per_token)
        points.append(roofline.decode_point(bound, r.server_step_ms / 1000, f"{r.model} B={r.batch}"))
    return points


def plot_tiny_decode(runs: pd.DataFrame, title: str = "Tiny dense vs tiny MoE on this machine") -> Any:
    """Output tokens/s against batch per model: every run as a dot, the mean as a line; legend outside."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
    for i, (name, part) in enumerate(runs.groupby("model")):
        ax.scatter(part["batch"], part["decode_tok_s"], s=12, alpha=0.5, color=f"C{i}")
        mean = part.groupby("batch")["decode_tok_s"].mean()
        ax.plot(mean.index, mean.values, marker="o", color=f"C{i}", label=f"{name} (mean of runs)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams (batch)")
    ax.set_ylabel("output tokens/s (server step time)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="dots: each run")
    return fig


def experts_share_outcome(distinct: float, num_experts: int) -> str:
    """'a few (under 25%)', 'about half (25-75%)' or 'most of them (over 75%)' of the experts touched."""
    share = distinct / num_experts
    return "a few (under 25%)" if share < 0.25 else "about half (25-75%)" if share <= 0.75 else "most of them (over 75%)"


# ---------------------------------------------------------------------------------------------
# GPU figures beside this run's CPU ones


def moe_roofline_table(dense: str, moe: str, gpu: Any, batches: list[int]) -> pd.DataFrame:
    """Per batch, the roofline's decode ceiling (tokens/s, all streams) on ``gpu`` of ``moe`` (the experts a batch
    touches), ``dense``, and ``moe`` as if it were dense (its weights, every parameter active), BF16, weights only;
    with the per-token time in ms and what bounds each step."""
    m = count_params(REFERENCE_CONFIGS / f"{moe}.json")
    d = count_params(REFERENCE_CONFIGS / f"{dense}.json")
    rows = []
    for b in sorted(set(batches)):
        bounds = {moe: roofline.decode_bound(gpu, roofline.moe_bytes_per_step(m, b), m.active, b),
                  dense: roofline.decode_bound(gpu, weight_bytes(d), d.active, b),
                  "same size, dense": roofline.decode_bound(gpu, weight_bytes(m), m.total, b)}
        row: dict[str, Any] = {"batch": b}
        for name, bound in bounds.items():
            row[f"{name}_tok_s"] = bound.tokens_per_s
            row[f"{name}_ms_per_token"] = 1000 / bound.tokens_per_s
            row[f"{name}_bound"] = bound.bound
        rows.append(row)
    return pd.DataFrame(rows)


def moe_beside_gpu(runs: pd.DataFrame, tiny_dense: str, tiny_moe: str | None, table: pd.DataFrame, dense: str,
                   moe: str, gpu_name: str) -> list[str]:
    """MoE against dense at batch three ways: this run's CPU number (the tiny models at the largest batch measured),
    the roofline on ``gpu_name`` (``moe_roofline_table``), and one published GPU measurement (``PUBLISHED_MOE``)."""
    lines = []
    measured = decode_table(runs)
    top = int(measured["batch"].max()) if len(measured) else None
    rates = {m: measured[(measured.model == m) & (measured.batch == top)]["decode_tok_s"] for m in (tiny_dense, tiny_moe)}
    if top is not None and all(len(r) for r in rates.values()):
        a, b = rates[tiny_dense].item(), rates[tiny_moe].item()
        lines.append(f"- This run (measured here, CPU): at batch {top} {tiny_moe} decodes {b:,.0f} tok/s against "
                     f"{tiny_dense}'s {a:,.0f} ({b / a:.2f}x); both compute the same per token, so no saving can show.")
    elif tiny_moe is None:
        lines.append(f"- This run: no MoE is served on this profile (section 3 said why), so {tiny_dense} has nothing "
                     "to be compared with.")
    else:
        lines.append(f"- This run: {tiny_dense} and {tiny_moe} were not both measured, so there is no CPU number.")
    small, large = table.iloc[0], table.iloc[-1]
    lines.append(
        f"- Roofline on {gpu_name} (computed, not measured; BF16 weights, full bandwidth and compute): per token {moe} "
        f"costs {small[f'{moe}_ms_per_token']:.3f} ms at batch {small.batch:.0f} against "
        f"{small['same size, dense_ms_per_token']:.3f} ms for a dense model of its size "
        f"({small['same size, dense_ms_per_token'] / small[f'{moe}_ms_per_token']:.1f}x cheaper) and "
        f"{small[f'{dense}_ms_per_token']:.3f} ms for {dense}; at batch {large.batch:.0f} "
        f"{large[f'{moe}_ms_per_token']:.4f} ms against {large['same size, dense_ms_per_token']:.4f} ms "
        f"({large['same size, dense_ms_per_token'] / large[f'{moe}_ms_per_token']:.1f}x, the dense one "
        f"{large['same size, dense_bound']}-bound) and {large[f'{dense}_ms_per_token']:.4f} ms for {dense}.")
    lines.append(f"- Published, not from this run: {PUBLISHED_MOE['claim']} ({PUBLISHED_MOE['source']}).")
    return lines


# ---------------------------------------------------------------------------------------------
# Section 1: what fits the workshop GPU, and the code exercise (the MoE's batch-1 ceiling)


def fits_lines(paper: dict[str, dict[str, float]], gpu: Any) -> list[str]:
    """Per model of ``paper_table``, whether its BF16 weights alone fit ``gpu``'s memory (the driver's figure), computed:
    where they do not, its batch-1 ceiling is what it would reach on a GPU that holds it."""
    lines = []
    for name, row in paper.items():
        need, have = row["bf16_weights_GB"], gpu.usable_memory_bytes / 1e9
        if need <= have:
            lines.append(f"{name}: {need:.1f} GB of BF16 weights fit the {gpu.name}'s {have:.1f} GB (the KV cache and "
                         "activations need the rest).")
        else:
            lines.append(f"{name}: {need:.1f} GB of BF16 weights exceed the {gpu.name}'s {have:.1f} GB: its batch-1 "
                         f"ceiling is what it would reach on a GPU that holds it ({need / have:.1f}x this memory).")
    return lines


MOE_CEILING_HINT = ("at batch 1 a decode step reads each weight it uses once: the active parameters (moe_counts.active), "
                    "2 bytes each in BF16; the bandwidth is gpu.bandwidth_gb_s GB/s, 1e9 bytes per GB")


def moe_ceiling_check(gpu: Any, moe: Any, dense: Any) -> Any:
    """The check of an attendee's batch-1 decode ceiling of the MoE (``moe``: its ``ParamCounts``) on ``gpu``, in
    tokens/s: None when it is bandwidth / (active parameters x 2 bytes), else the sentence naming the likely slip (every
    expert read, numbers for bytes, FP32, GB for bytes, the dense model's count)."""
    import math

    bandwidth = gpu.bandwidth_gb_s * 1e9
    right = bandwidth / (moe.active * 2)
    slips = [
        (bandwidth / (moe.total * 2), f"that reads all {moe.total / 1e9:.1f} B parameters, every expert: at batch 1 a "
                                      f"token reads only its {moe.experts_per_token} experts per layer (moe_counts.active)."),
        (bandwidth / moe.active, "that counts parameters, not bytes: each is 2 bytes in BF16."),
        (bandwidth / (moe.active * 4), "4 bytes per parameter is FP32; the weights are BF16 here, 2 bytes."),
        (gpu.bandwidth_gb_s / (moe.active * 2), "the bandwidth is in GB/s: multiply by 1e9 for bytes per second."),
        (bandwidth / (dense.active * 2), "those are the dense model's parameters (dense_counts): use moe_counts."),
    ]

    def check(answer: Any) -> str | None:
        if isinstance(answer, bool) or not isinstance(answer, (int, float)):
            return f"my_moe_ceiling_tok_s must be a number of tokens per second, not {type(answer).__name__}."
        if math.isclose(answer, right, rel_tol=1e-3):
            return None
        for value, why in slips:
            if math.isclose(answer, value, rel_tol=1e-3):
                return why
        return (f"{answer:,.4g} tokens/s is not it: divide the bandwidth in bytes per second by the bytes one step "
                "reads.")

    return check


CEILING_RATIO_CHOICES = ("shrinks", "stays about the same", "grows")


def ceiling_ratio_outcome(dense: str, moe: str, before_gpu: Any, after_gpu: Any) -> tuple[str, str]:
    """Exercise 3: the MoE's batch-1 decode ceiling over the dense model's on ``before_gpu`` and on ``after_gpu``
    (``paper_table``): one of ``CEILING_RATIO_CHOICES`` (within 5% is the same) and the numbers behind it."""
    ratios = []
    for gpu in (before_gpu, after_gpu):
        paper, key = paper_table([dense, moe], gpu), ceiling_key(gpu)
        ratios.append(paper[moe][key] / paper[dense][key])
    before, after = ratios
    return (ratio_outcome(before, after, 0.05, CEILING_RATIO_CHOICES),
            f"{before:.2f}x on {before_gpu.name}, {after:.2f}x on {after_gpu.name}: both ceilings are bandwidth / "
            "bytes per step, so the bandwidth cancels: the ratio is the ratio of bytes read, whatever the GPU.")
