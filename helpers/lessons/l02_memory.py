"""The memory explorer of notebook 02: the planner behind a few controls, drawn as one bar.

``memory_picture`` plans one choice and returns the figure (its title says "does not fit" and why whenever
the planner does); ``explorer_controls`` builds the controls with their full labels, the GPUs named with
the memory their driver reports. The notebook passes both to ``ipywidgets.interact`` with ``show_memory``.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from helpers.lessons import plots
from helpers.hardware.gpus import GPUS
from helpers.planning.memory import REFERENCE_CONFIGS, GIB, fit_title, plan_memory, plan_row

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
