"""The memory explorer of notebook 02: its title agrees with the planner, max_model_len shows, labels are whole."""

from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from helpers.lessons import l02_memory as explorer  # noqa: E402
from helpers.hardware.gpus import GPUS  # noqa: E402
from helpers.planning.shape import GIB  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_the_title_says_does_not_fit_exactly_when_the_planner_says_so():
    seen = {True: 0, False: 0}
    for model, gpu, weights, max_len in itertools.product(["Qwen3-4B", "Llama-3.3-70B", "Qwen3-30B-A3B"],
                                                          ["RTX 4000 Ada", "L4", "H100 SXM"], ["bf16", "fp8"],
                                                          [4096, 65536, 131072]):
        row = explorer.memory_row(model, gpu, weights, "bf16", 0.9, max_len, 8192)
        title = explorer.memory_picture(model, gpu, weights, "bf16", 0.9, max_len, 8192).axes[0].get_title()
        title = title.replace("\n", " ")
        assert ("does not fit" in title) == (not row["fits"]), title
        assert (" fits " in title) == row["fits"], title
        seen[row["fits"]] += 1
        plt.close("all")
    assert seen[True] and seen[False]  # the grid has plans both ways


def test_the_title_says_why_weights_or_max_model_len():
    weights = explorer.memory_picture("Llama-3.3-70B", "RTX 4000 Ada", "fp8", "bf16", 0.9, 16384, 8192)
    assert "does not fit: the weights alone" in weights.axes[0].get_title().replace("\n", " ")
    row = explorer.memory_row("Qwen3-4B", "RTX 4000 Ada", "bf16", "bf16", 0.9, 16384)
    too_long = row["kv_cache_tokens"] + 2048  # one request longer than the whole KV cache
    title = explorer.memory_picture("Qwen3-4B", "RTX 4000 Ada", "bf16", "bf16", 0.9, too_long).axes[0].get_title()
    assert f"does not fit: max_model_len {too_long:,} tokens is above the KV cache's" in title.replace("\n", " ")
    assert matplotlib.colors.same_color(weights.axes[0].title.get_color(), "tab:red")


def _request_ticks(fig) -> int:
    return sum(len(c.get_segments()) for c in fig.axes[0].collections if c.get_label() == "end of each max_model_len request")


def test_max_model_len_changes_the_count_in_the_title_and_the_ticks_in_the_bar():
    short, long = (explorer.memory_row("Qwen3-4B", "RTX 4000 Ada", "bf16", "bf16", 0.9, n) for n in (8192, 32768))
    assert short["requests_at_max_len"] > long["requests_at_max_len"] >= 1 and short["fits"] and long["fits"]
    for row in (short, long):
        fig = explorer.memory_picture("Qwen3-4B", "RTX 4000 Ada", "bf16", "bf16", 0.9, row["max_model_len"])
        title = fig.axes[0].get_title().replace("\n", " ")
        assert f"fits {row['requests_at_max_len']} conversation" in title
        assert f"max_model_len {row['max_model_len']:,} tokens" in title
        assert _request_ticks(fig) == row["requests_at_max_len"]


def test_the_legend_sits_outside_the_bars_and_the_labels_are_whole():
    fig = explorer.memory_picture("Qwen3-4B", "RTX 4000 Ada", "bf16", "bf16", 0.9, 16384)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    [legend] = fig.legends
    axes_box, legend_box = fig.axes[0].get_window_extent(renderer), legend.get_window_extent(renderer)
    assert not axes_box.overlaps(legend_box)
    title_box = fig.axes[0].title.get_window_extent(renderer)
    assert not title_box.overlaps(legend_box) and fig.bbox.contains(title_box.x0, title_box.y1 - 1)
    labels = {t.get_text() for t in legend.get_texts()}
    assert {"weights", "KV cache", "memory the driver reports", "end of each max_model_len request"} <= labels


def test_controls_have_full_labels_and_name_each_gpu_with_its_driver_memory():
    controls = explorer.explorer_controls("Qwen3-4B", "RTX 4000 Ada", 0.9, 16384, 8192)
    for name in ("model", "gpu_name", "weight_dtype", "kv_dtype", "utilization", "max_model_len"):
        assert controls[name].description and controls[name].style.description_width == "initial", name
    assert controls["max_model_len"].description == "--max-model-len (tokens)"
    labels = dict((value, label) for label, value in controls["gpu_name"].options)
    assert set(labels) == {g.name for g in GPUS} and controls["gpu_name"].value == "RTX 4000 Ada"
    for gpu in GPUS:
        assert f"{gpu.usable_memory_mib:,} MiB = {gpu.usable_memory_mib * 2**20 / GIB:.1f} GiB" in labels[gpu.name]
    assert controls["conversation_tokens"].value == 8192  # fixed: passed through, no control


def test_show_memory_returns_nothing_so_interact_shows_the_figure_once():
    assert explorer.show_memory(model="Qwen3-4B", gpu_name="L4", weight_dtype="bf16", kv_dtype="bf16",
                                utilization=0.9, max_model_len=8192, conversation_tokens=None) is None
    assert plt.get_fignums()  # the figure was drawn
