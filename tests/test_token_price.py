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


def test_a_looser_target_is_cheaper_only_when_it_lets_a_bigger_batch_through():
    from helpers.lessons.l07_saturation import PRICE_CHOICES, looser_target_outcome, machine_price_conclusion

    runs = tp.sweep_price_frame({"s": SWEEP}, 3.6)
    here = tp.cheapest_at_targets(runs, [50, 100, 400])  # the tightest met: 100 ms, at concurrency 1
    outcome, detail = looser_target_outcome(runs, here, 2)  # 200 ms admits concurrency 4: 3.6x the tokens/s
    assert outcome == "cheaper" and outcome in PRICE_CHOICES and "(c=1)" in detail and "(c=4)" in detail
    assert "a looser target lets a bigger batch through" in detail
    same, why = looser_target_outcome(runs, tp.cheapest_at_targets(runs, [400]), 2)  # 333 ms met already, 800 ms too
    assert same == "about the same" and "the same batch meets both" in why
    flat = tp.sweep_price_frame({"s": SWEEP.assign(output_throughput=[10.0, 10.2, 10.3])}, 3.6)
    assert looser_target_outcome(flat, tp.cheapest_at_targets(flat, [100]), 2)[0] == "about the same"
    assert looser_target_outcome(runs, tp.cheapest_at_targets(runs, [50]), 2)[0] == "about the same"  # none met
    assert machine_price_conclusion(here).verdict == "shown"


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


# ---------------------------------------------------------------- the real step's terms (helpers/planning/price_curve.py)

from helpers.core.conclusion import NOT_SHOWN, SHOWN  # noqa: E402
from helpers.planning import price_curve as pc  # noqa: E402

SHAPE = pc.shape_of(LLAMA_70B, REFERENCE_CONFIGS / "Llama-3.3-70B.json")


def test_allreduce_follows_the_measured_table_then_the_bus_bandwidth():
    assert pc.allreduce_s(1 << 20, 1) == 0.0  # one GPU: nothing to reduce
    assert pc.allreduce_s(100, 8) == pytest.approx(10.1e-6)  # below the smallest size: its latency floor
    assert pc.allreduce_s(1 << 20, 8) == pytest.approx(24.1e-6)
    assert pc.allreduce_s(1.5 * (1 << 20), 8) == pytest.approx((24.1e-6 + 30.4e-6) / 2)
    beyond = pc.allreduce_s(8 << 20, 8)
    assert beyond == pytest.approx(45.0e-6 + (4 << 20) * 2 * 7 / 8 / 480e9)


def test_a_step_without_terms_is_the_roofline_and_each_term_makes_it_longer():
    h100 = get_gpu("H100 SXM")
    ideal = pc.step_time_s(h100, 8, SHAPE, 1, 1024, 1024, terms=())
    frame = tp.roofline_price_frame(h100, 8, LLAMA_70B, 1.0, 1024, 1024)
    assert ideal * 1e3 == pytest.approx(frame.iloc[0]["tpot_ms"])
    times = [pc.step_time_s(h100, 8, SHAPE, 64, 1024, 1024, pc.TERMS[:k]) for k in range(len(pc.TERMS) + 1)]
    assert times == sorted(times) and times[-1] - times[-2] == pytest.approx(pc.REAL_STEP.step_overhead_s)
    assert pc.step_time_s(h100, 1, SHAPE, 1, 1024, 1024, ("all-reduce",)) == \
        pytest.approx(pc.step_time_s(h100, 1, SHAPE, 1, 1024, 1024, ()))  # one GPU: no all-reduce
    with pytest.raises(ValueError, match="unknown terms"):
        pc.step_time_s(h100, 8, SHAPE, 1, 1024, 1024, ("luck",))
    with pytest.raises(ValueError, match="share of the datasheet peak"):
        pc.RealStep(compute=1.5)


def test_the_cheapest_batch_meets_the_target_and_none_when_batch_1_is_too_slow():
    h100 = get_gpu("H100 SXM")
    best = pc.cheapest_s(h100, 8, SHAPE, 700, 32.0, 1024, 1024, 0.030)
    assert best["tpot_ms"] <= 30 and pc.step_time_s(h100, 8, SHAPE, best["batch"] + 1, 1024, 1024) > 0.030
    assert math.isnan(pc.cheapest_s(h100, 8, SHAPE, 700, 32.0, 1024, 1024, 0.005)["usd_per_million_tokens"])


def _attribution(ideal, steps, ref):
    rows = [{"target_tpot_ms": 20, "curve": "ideal", "usd_per_million_tokens": ideal}]
    rows += [{"target_tpot_ms": 20, "curve": f"+ {t}", "usd_per_million_tokens": p} for t, p in zip(pc.TERMS, steps)]
    return pc.term_attribution(pd.DataFrame(rows), {20: ref})


def test_term_shares_and_what_is_left_add_up_both_ways():
    under = _attribution(0.30, [0.35, 0.35, 0.40, 0.45], 0.50).iloc[0]  # terms explain 75% of the gap
    assert under["bandwidth_share"] == pytest.approx(0.25) and under["unexplained_share"] == pytest.approx(0.25)
    over = _attribution(0.30, [0.60, 0.60, 0.90, 1.10], 0.50).iloc[0]  # terms overshoot the reference
    assert sum(over[f"{t}_share"] for t in pc.TERMS) + over["unexplained_share"] == pytest.approx(1.0)
    assert over["unexplained_share"] == pytest.approx(-3.0)
    assert "left unexplained" in pc.attribution_sentences(_attribution(0.30, [0.35, 0.35, 0.40, 0.45], 0.50), "ref")[0]
    assert "2.2x ref's" in pc.attribution_sentences(_attribution(0.30, [0.60, 0.60, 0.90, 1.10], 0.50), "ref")[0]


def test_gap_conclusions_flip_with_the_numbers():
    def frame(ideal, adjusted, ref):
        rows = []
        for t, i, a, r in zip((10, 30), ideal, adjusted, ref):
            rows.append({"target_tpot_ms": t, "ideal_usd": i, "adjusted_usd": a, "reference_usd": r,
                         **{f"{x}_share": 0.25 for x in pc.TERMS}, "unexplained_share": 0.0})
        return pd.DataFrame(rows)

    steep, *_, explained = pc.gap_conclusions(frame((0.35, 0.32), (0.70, 0.45), (0.71, 0.46)), "the talk")
    assert steep.verdict == SHOWN and explained.verdict == SHOWN and "within 25%" in explained.text
    flat, *_, over = pc.gap_conclusions(frame((0.35, 0.32), (2.0, 1.9), (0.71, 0.46)), "the talk")
    assert flat.verdict == NOT_SHOWN and over.verdict == NOT_SHOWN and "overshoot" in over.text
    *_, under = pc.gap_conclusions(frame((0.35, 0.32), (0.40, 0.33), (0.71, 0.46)), "the talk")
    assert under.verdict == NOT_SHOWN and "margin" in under.text
    missed, *_ = pc.gap_conclusions(frame((0.35, 0.32), (math.nan, 1.0), (0.71, 0.46)), "the talk")
    assert missed.verdict == SHOWN and "cannot meet 10 ms" in missed.text


def test_the_real_step_names_a_source_for_every_term_and_the_roofline_tpot_of_a_group():
    text = pc.sources_text()
    assert all(f"  {t}: " in text for t in pc.TERMS) and text.count("source: ") == 4 and "(20" in text
    tpot = tp.group_tpot_ms("H100 SXM", 4, LLAMA_70B, 1, 0)
    assert tpot == pytest.approx(LLAMA_70B.weight_bytes / (4 * get_gpu("H100 SXM").bandwidth_bytes_per_s) * 1e3)
