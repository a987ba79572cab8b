"""The price of a token against the latency target: from a measured sweep and from the roofline."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers.planning import token_price as tp  # noqa: E402
from helpers.hardware.gpus import HOURLY_PRICES, get_gpu, hourly_price  # noqa: E402
from helpers.planning.shape import REFERENCE_CONFIGS  # noqa: E402
from helpers.lessons.l07_saturation import faster_is_dearer, gpus_needed_conclusion  # noqa: E402

SWEEP = pd.DataFrame({"concurrency": [1, 4, 16], "output_throughput": [10.0, 36.0, 48.0],
                      "median_tpot_ms": [100.0, 111.0, 333.0]})
LLAMA_70B = tp.model_on_gpu("Llama 3 70B", REFERENCE_CONFIGS / "Llama-3.3-70B.json")


def test_sweep_prices_per_run_and_cheapest_per_target():
    frame = tp.sweep_price_frame({"cap 4": SWEEP}, hourly_usd=3.6)
    assert list(frame["usd_per_million_tokens"]) == pytest.approx([100.0, 100 / 3.6, 100 / 4.8])
    best = tp.cheapest_at_targets(frame, [50, 100, 120, 400])
    assert math.isnan(best.loc[0, "usd_per_million_tokens"])  # nothing is that fast
    assert list(best["concurrency"][1:]) == [1, 4, 16]  # a looser target admits a bigger batch
    assert tp.relative_targets_ms(100.0, [4, 1.25]) == [125.0, 400.0]
    with pytest.raises(ValueError, match="sweep"):
        tp.sweep_price_frame({"empty": SWEEP.iloc[0:0]}, 1.0)


def test_faster_is_dearer_flips_with_the_numbers():
    best = tp.cheapest_at_targets(tp.sweep_price_frame({"s": SWEEP}, 3.6), [50, 100, 400])
    shown = faster_is_dearer(best, "this machine")
    assert shown.verdict == "shown" and "no setup meets 50 ms" in shown.text and "4.8x more" in shown.text
    flat = tp.cheapest_at_targets(tp.sweep_price_frame({"s": SWEEP}, 3.6), [400, 500])
    assert faster_is_dearer(flat, "this machine").verdict == "not shown"  # one batch meets both
    close = SWEEP.assign(output_throughput=[10.0, 10.2, 10.3])
    noisy = tp.cheapest_at_targets(tp.sweep_price_frame({"s": close}, 3.6), [100, 400])
    assert faster_is_dearer(noisy, "s").verdict == "within noise"


def test_llama_70b_bf16_needs_two_h100s_and_a_faster_token_costs_more():
    h100 = get_gpu("H100 SXM")
    assert LLAMA_70B.weight_bytes == pytest.approx(141.1e9, rel=0.01)  # 70.6 B parameters x 2 bytes
    assert tp.min_gpus(h100, LLAMA_70B, 2048) == 2  # 141 GB of weights exceed one 80 GB card
    assert tp.max_batch(h100, 1, LLAMA_70B, 2048) == 0
    table = tp.gpu_price_table({"H100 SXM": hourly_price("H100 SXM").usd_per_hour}, LLAMA_70B, [10, 20, 30], 1024, 1024)
    prices = list(table["usd_per_million_tokens"])
    assert prices[0] > prices[2] and prices == sorted(prices, reverse=True)
    assert (table["tpot_ms"] <= table["target_tpot_ms"]).all()
    # at 10 ms a batch-1 step on 2 GPUs (141 GB / 6.7 TB/s = 21 ms) is too slow: the cheapest setup uses more
    assert table.loc[0, "num_gpus"] > 2


def test_roofline_frame_has_the_ceiling_arithmetic():
    h100 = get_gpu("H100 SXM")
    frame = tp.roofline_price_frame(h100, 2, LLAMA_70B, 2.0, 1024, 1024)
    first = frame.iloc[0]
    assert first["concurrency"] == 1 and first["tpot_ms"] == pytest.approx(
        (LLAMA_70B.weight_bytes + 1536 * LLAMA_70B.kv_bytes_per_token) / (2 * h100.bandwidth_bytes_per_s) * 1e3)
    assert first["usd_per_million_tokens"] == pytest.approx(4.0 / (first["output_tokens_per_s"] * 3600) * 1e6)
    assert frame["concurrency"].max() == tp.max_batch(h100, 2, LLAMA_70B, 2048)
    with pytest.raises(ValueError, match="does not fit"):
        tp.roofline_price_frame(h100, 1, LLAMA_70B, 2.0, 1024, 1024)


def test_every_price_names_its_source_and_a_gpu_of_the_table():
    for price in HOURLY_PRICES:
        assert price.usd_per_hour > 0 and price.source
        if "VM" not in price.name:
            get_gpu(price.name)
    with pytest.raises(LookupError, match="pass your own price"):
        hourly_price("TPU v5e")


def test_the_figure_and_the_gpus_sentence():
    table = tp.gpu_price_table({"H100 SXM": 2.99}, LLAMA_70B, [10, 20, 30], 1024, 1024)
    fig = tp.plot_price_vs_target({"H100 SXM": table}, "price against target")
    assert list(fig.axes[0].lines[0].get_xdata()) == [10, 20, 30]
    text = gpus_needed_conclusion(table, "H100 SXM", "Llama 3 70B", 1024, 1024).text
    assert "at least 2 GPUs" in text and "10 ms: 8 GPUs" in text


def test_the_notebooks_inputs_say_where_they_come_from():
    usd, source = tp.machine_price("cpu")
    assert usd == hourly_price("2-vCPU VM").usd_per_hour and "e2-standard-2" in source
    assert tp.machine_price("cpu", 0.5) == (0.5, "your HOURLY_USD parameter")
    with pytest.raises(ValueError, match="positive"):
        tp.machine_price("cpu", -1)
    assert "assumed one H100" in tp.machine_price("gpu")[1]
    assert "H100 SXM" in tp.gpu_prices() and "2-vCPU VM" not in tp.gpu_prices()
    with pytest.raises(ValueError, match="choose one of"):
        tp.reference_config("Llama-9-1T")
    table = tp.gpu_price_table({"H100 SXM": hourly_price("H100 SXM").usd_per_hour, "A10G": 1.0}, LLAMA_70B, [10, 30], 1024, 1024)
    pivot = tp.price_pivot(table)
    assert list(pivot.columns) == ["<= 10 ms", "<= 30 ms"] and pivot.loc["A10G", "<= 10 ms"] == "-"
    assert "GPUs x" in pivot.loc["H100 SXM", "<= 10 ms"]
    at = tp.price_at("H100 SXM", LLAMA_70B, 30, 1024, 1024)
    assert at["usd_per_million_tokens"] == pytest.approx(table.usd_per_million_tokens.iloc[1]) and at["bound"] == "compute"
    assert tp.price_at("H100 SXM", LLAMA_70B, 10, 1024, 1024)["bound"] == "memory"
    assert set(tp.gpu_curves(LLAMA_70B, 1024, 1024, [10, 30])) <= set(tp.gpu_prices())
