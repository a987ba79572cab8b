"""What notebook 02 (units and the memory budget) needs beyond the floors below: the explorer, the conclusions,
the exercises and the check against a running engine. The rest of what the notebook calls comes from the floors
and is re-exported here (``__all__``), so the notebook imports from this module and ``helpers.engine.session`` alone.

``memory_picture`` plans one choice and returns the figure (its title says "does not fit" and why whenever
the planner does); ``explorer_controls`` builds the controls with their full labels, the GPUs named with
the memory their driver reports. The notebook passes both to ``ipywidgets.interact`` with ``show_memory``.
``conclude_memory_plan`` turns three plans into the lesson's sentences; ``engine_comparison`` puts the
planner's prediction beside what a running vLLM reports (``vllm:cache_config_info``), and
``conclude_engine_comparison`` says whether they agree; ``conversations_outcome`` and
``larger_gpus_hold_more`` check the exercises. ``conclude_hand_count`` holds the parameters and KV bytes per token
the notebook computes by hand from config.json against the planner's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
from matplotlib.figure import Figure

from helpers.core.models import by_profile, workshop_gpu
from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion, plural, report
from helpers.core.lesson import (check_exercise, check_prediction, should_see, should_see_conclusion, show_conclusions,
                                 show_solution)
from helpers.core.tables import format_tables
from helpers.core.vllm_args import flag_value
from helpers.lessons import plots
from helpers.hardware.gpus import GPUS, get_gpu
from helpers.measure.server_metrics import scrape
from helpers.planning.kv import CPU_BLOCK_SIZE, GPU_BLOCK_SIZE, VllmKVCache, cpu_kv_cache, kv_cache_bytes
from helpers.planning.memory import MemoryPlan, fit_title, fit_verdict, plan_memory, plan_row
from helpers.planning.shape import (GIB, REFERENCE_CONFIGS, ConfigError, ModelSource, count_params, load_config,
                                    model_shape)

__all__ = [
    # this notebook's own
    "WEIGHT_DTYPES", "KV_DTYPES", "MAX_MODEL_LEN_RANGE", "model_names", "gpu_choices", "memory_row", "memory_picture",
    "show_memory", "explorer_controls", "block_size_note", "conclude_memory_plan", "conclude_engine_comparison",
    "predict_cpu_engine_kv", "engine_comparison", "compare_with_engine", "CONVERSATION_CHOICES",
    "larger_gpus_hold_more", "conversations_outcome", "longer_max_len_outcome", "conclude_hand_count", "HAND_COUNT_REL",
    "ANSWERS",
    # from the floors below, for the notebook
    "report", "check_prediction", "should_see", "should_see_conclusion", "show_conclusions", "format_tables", "plots",
    "get_gpu", "scrape", "plan_memory", "plan_row", "GIB", "REFERENCE_CONFIGS", "count_params", "load_config",
    "by_profile", "workshop_gpu",
    "check_exercise", "show_solution", "kv_bytes_check", "KV_BYTES_HINT",
]

# issue 42: what gives each core-path check's answer away; tests/test_core_path.py fails if a phrase shows above it
ANSWERS: dict[str, tuple[str, ...]] = {
    "2. Where the memory goes on the workshop GPU and on others": ("147,456", "2 * L * n_kv * d * 2"),
    "Exercise 1: an FP8 KV cache with BF16 weights": ("halves the bytes per token", "twice the tokens"),
    "Exercise 2: a four times longer `--max-model-len`": ("only raises the cap on one request",),
}

# The hand count leaves out norms and biases: under 0.1% of a dense model's parameters (Qwen3-4B: 0.01%).
HAND_COUNT_REL = 0.001

WEIGHT_DTYPES = ["bf16", "fp8", "int8", "int4", "nvfp4", "mxfp4"]
KV_DTYPES = ["bf16", "fp8"]
MAX_MODEL_LEN_RANGE = (2048, 131072, 2048)  # tokens: min, max, step of the slider


def model_names() -> list[str]:
    """The models with a published config in ``helpers/data/configs``, sorted."""
    return sorted(p.stem for p in REFERENCE_CONFIGS.glob("*.json"))


def gpu_choices() -> list[tuple[str, str]]:
    """(label, name) per GPU of the table; the label gives the memory the driver reports (nvidia-smi's MiB and
    GiB), not the datasheet's decimal GB."""
    out = []
    for gpu in GPUS:
        mib = gpu.usable_memory_bytes // 2**20
        out.append((f"{gpu.name}: {mib:,} MiB = {gpu.usable_memory_bytes / GIB:.1f} GiB", gpu.name))
    return out


def memory_row(model: str, gpu_name: str, weight_dtype: str, kv_dtype: str, utilization: float, max_model_len: int,
               conversation_tokens: int | None = None) -> dict[str, Any]:
    """``plan_row`` of one explorer choice (a model of ``helpers/data/configs``, a GPU of the table)."""
    plan = plan_memory(REFERENCE_CONFIGS / f"{model}.json", gpu=gpu_name, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                       gpu_memory_utilization=utilization, max_model_len=max_model_len)
    return plan_row(plan, conversation_tokens)


def memory_picture(model: str, gpu_name: str, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                   utilization: float = 0.9, max_model_len: int = 16384, conversation_tokens: int | None = None) -> Figure:
    """The bar of one choice, titled with ``fit_title``: "does not fit" and why, or how many requests of
    max_model_len tokens fit at once (a tick in the KV cache after each)."""
    row = memory_row(model, gpu_name, weight_dtype, kv_dtype, utilization, max_model_len, conversation_tokens)
    frame = pd.DataFrame([row]).assign(choice=f"{weight_dtype} weights, {kv_dtype} KV")
    return plots.memory_budget(frame, label="choice", title=fit_title(row, conversation_tokens))


def show_memory(**choice: Any) -> None:
    """``memory_picture`` for ``ipywidgets.interact``, which shows the figure the call draws (returning it would
    show it twice)."""
    memory_picture(**choice)


def explorer_controls(model: str, gpu_name: str, utilization: float, max_model_len: int,
                      conversation_tokens: int | None = None) -> dict[str, Any]:
    """The explorer's controls for ``ipywidgets.interact(show_memory, **controls)``, labelled in full."""
    import ipywidgets as widgets

    wide = {"style": {"description_width": "initial"}, "layout": widgets.Layout(width="520px")}
    low, high, step = MAX_MODEL_LEN_RANGE
    return {
        "model": widgets.Dropdown(options=model_names(), value=model, description="model", **wide),
        "gpu_name": widgets.Dropdown(options=gpu_choices(), value=gpu_name,
                                     description="GPU (memory the driver reports)", **wide),
        "weight_dtype": widgets.Dropdown(options=WEIGHT_DTYPES, value="bf16", description="weight dtype", **wide),
        "kv_dtype": widgets.Dropdown(options=KV_DTYPES, value="bf16", description="KV cache dtype", **wide),
        "utilization": widgets.FloatSlider(value=utilization, min=0.3, max=0.95, step=0.05,
                                           description="--gpu-memory-utilization", **wide),
        "max_model_len": widgets.IntSlider(value=max_model_len, min=low, max=max(high, max_model_len), step=step,
                                           description="--max-model-len (tokens)", **wide),
        "conversation_tokens": widgets.fixed(conversation_tokens),
    }


# ---------------------------------------------------------------- notebook 02: conclusions, and the running engine

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


def conclude_hand_count(model: str, params_by_hand: int, kv_bytes_per_token_by_hand: int,
                        plan: MemoryPlan) -> Conclusion:
    """The parameters and KV bytes per token computed by hand from config.json against the planner's: parameters
    within ``HAND_COUNT_REL`` (the hand count leaves out norms and biases), KV bytes per token exactly. A model the
    dense-GQA formulas do not describe (experts, latent attention, sliding or linear layers) cannot tell."""
    expectation = "the planner confirms the hand count: parameters within 0.1% (norms, biases), KV bytes exactly"
    shape = model_shape(REFERENCE_CONFIGS / f"{model}.json") if (REFERENCE_CONFIGS / f"{model}.json").is_file() \
        else None
    gap = (plan.total_params - params_by_hand) / plan.total_params
    text = (f"{model}: by hand {params_by_hand:,} parameters and {kv_bytes_per_token_by_hand:,} KV bytes per token; "
            f"the planner {plan.total_params:,} ({gap:+.3%}) and {plan.kv_bytes_per_token:,}")
    if shape is not None and (shape.num_experts or shape.mla or not plan.kv.is_uniform):
        return Conclusion(text + ": the hand formulas are for a dense model with grouped-query attention in every "
                          "layer, which this one is not (see notebook 04 for experts).", "", expectation)
    if abs(gap) <= HAND_COUNT_REL and kv_bytes_per_token_by_hand == plan.kv_bytes_per_token:
        return Conclusion(text + ": the same arithmetic; the planner adds the norms and biases.", SHOWN, expectation)
    return Conclusion(text + ": they differ; check the fields read from config.json (head_dim, KV heads, tied "
                      "embeddings) and the bytes per element.", NOT_SHOWN, expectation)


def conclude_engine_comparison(comparison: pd.DataFrame | None, profile: str) -> Conclusion:
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
                      reported: Mapping[str, Any] | None) -> pd.DataFrame:
    """The prediction next to what vLLM reports when the engine's flags set its KV memory and the model's config
    is here (the CPU engine the helpers run); otherwise vLLM's figures alone (an endpoint run elsewhere, a GPU)."""
    sized = all(isinstance(flag_value(engine_args, f), str) for f in ("--kv-cache-memory-bytes", "--max-model-len"))
    if sized and (Path(str(model)) / "config.json").is_file():
        return compare_with_engine(predict_cpu_engine_kv(model, engine_args), reported)
    return pd.DataFrame({"vLLM reports": dict(reported or {})}, dtype=object)


def compare_with_engine(predicted: VllmKVCache, reported: Mapping[str, Any] | None) -> pd.DataFrame:
    """Prediction and ``vllm:cache_config_info`` side by side (one row per figure)."""
    reported = reported or {}
    ours = {"num_gpu_blocks": predicted.num_blocks, "block_size": predicted.block_size,
            "kv_cache_size_tokens": predicted.vllm_kv_cache_size_tokens,
            "kv_cache_max_concurrency": round(predicted.max_concurrency, 2)}
    rows = [{"figure": k, "predicted": v, "vLLM reports": reported.get(k)} for k, v in ours.items()]
    return pd.DataFrame(rows, dtype=object).set_index("figure")


# ---------------------------------------------------------------- notebook 02: checks and exercises

CONVERSATION_CHOICES = ("vLLM would refuse to start", "fewer", "about the same", "more, but less than twice",
                        "about twice as many or more")


def larger_gpus_hold_more(rows: pd.DataFrame, conversation_tokens: int) -> tuple[bool, str]:
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


def longer_max_len_outcome(before: Mapping[str, Any], after: Mapping[str, Any],
                           conversation_tokens: int) -> tuple[str, str]:
    """``conversations_outcome`` for a longer ``--max-model-len`` (``plan_row`` rows before and after), with why."""
    outcome, detail = conversations_outcome(before, after, conversation_tokens)
    if outcome == CONVERSATION_CHOICES[0]:
        why = "vLLM refuses a --max-model-len longer than its whole KV cache holds, since one request could not fit."
    else:
        why = ("A longer --max-model-len only raises the cap on one request: the KV cache is the memory left after the "
               "weights and the overhead, whatever the cap, so conversations of the same length fit as before.")
    return outcome, f"{detail} {why}"


# ---------------------------------------------------------------- the exercise: KV bytes per token by hand

KV_BYTES_HINT = ("every layer keeps, for each token, one key and one value vector per KV head, each head_dim numbers "
                 "of 2 bytes (BF16): multiply those five factors")


def kv_bytes_check(layers: int, query_heads: int, kv_heads: int, head_dim: int,
                   bytes_per_element: int = 2) -> Callable[[Any], str | None]:
    """The check of an attendee's KV bytes per token for a model of this shape: None when it is
    2 x ``layers`` x ``kv_heads`` x ``head_dim`` x ``bytes_per_element``, else the sentence naming the likely slip."""
    right = 2 * layers * kv_heads * head_dim * bytes_per_element
    slips = [
        (2 * layers * query_heads * head_dim * bytes_per_element,
         f"that uses the {query_heads} query heads: with grouped-query attention only the {kv_heads} KV heads are "
         "cached (num_key_value_heads)."),
        (right // 2, "that is half: a key and a value are cached for each head (x 2)."),
        (2 * layers * kv_heads * head_dim, f"that counts numbers, not bytes: each is {bytes_per_element} bytes in BF16."),
        (2 * layers * kv_heads * head_dim * 4, "4 bytes per number is FP32; the cache is BF16 here, 2 bytes."),
        (2 * kv_heads * head_dim * bytes_per_element,
         f"that is one layer's worth: each of the {layers} layers keeps its own keys and values."),
    ]

    def check(answer: Any) -> str | None:
        if isinstance(answer, bool) or not isinstance(answer, (int, float)):
            return f"kv_bytes_by_hand must be a number of bytes, not {type(answer).__name__}."
        if answer == right:
            return None
        reasons = [why for value, why in slips if value != right and answer == value]
        if reasons:  # in BF16 a missing V and a missing byte count give the same number: both are said
            return " Or ".join(reasons)
        return (f"{answer:,} bytes per token is not it: multiply K and V (2), the layers, the KV heads, head_dim and "
                "the bytes per number.")

    return check
