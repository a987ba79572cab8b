"""The knee of a sweep and the limit behind it, on synthetic sweeps of each kind; the sweep figures."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from helpers.lessons import plots
from helpers.measure import saturation  # noqa: E402
from helpers.measure.saturation import analyze_sweep, classify_limit, find_knee  # noqa: E402

CONCURRENCY = [1, 4, 8, 16, 32]


def gauges(running, waiting, kv, preemptions=0.0, n: int = 20) -> pd.DataFrame:
    """n samples of a run; scalars are held constant, arrays used as they are."""
    col = lambda v: np.broadcast_to(np.asarray(v, dtype=float), (n,)).copy()  # noqa: E731
    return pd.DataFrame({"t_s": np.arange(n) * 0.5, "kv_cache_usage": col(kv), "num_requests_running": col(running),
                         "num_requests_waiting": col(waiting), "num_preemptions": col(preemptions)})


def summaries(throughput, ttft_ms):
    return [{"mode": "concurrency", "concurrency": c, "max_concurrency": c, "request_rate": "inf",
             "output_throughput": thr, "request_throughput": thr / 128, "median_ttft_ms": ttft,
             "p99_ttft_ms": ttft * 2, "median_tpot_ms": 10 + c, "median_tokens_per_s_per_user": 1000 / (10 + c)}
            for c, thr, ttft in zip(CONCURRENCY, throughput, ttft_ms)]


def scheduler_sweep():
    runs = summaries([100, 380, 700, 730, 740], [20, 22, 25, 400, 1200])
    frames = [gauges(min(c, 8), max(0, c - 8), 0.05 * min(c, 8)) for c in CONCURRENCY]
    return runs, frames


def test_scheduler_cap():
    runs, frames = scheduler_sweep()
    result = analyze_sweep(runs, frames, max_num_seqs=8)
    assert result.knee_index == 2 and result.knee_load == 8
    assert result.limit == "scheduler"
    assert "max-num-seqs" in result.reason
    inferred = analyze_sweep(runs, frames)  # max-num-seqs not given: the highest running count stands in
    assert inferred.limit == "scheduler" and "inferred" in inferred.reason


def test_kv_memory():
    runs = summaries([100, 380, 700, 760, 770], [20, 22, 26, 300, 900])
    frames = [gauges(min(c, 14), max(0, c - 14), min(1.0, 0.07 * c)) for c in CONCURRENCY[:-1]]
    frames.append(gauges(running=np.r_[np.full(10, 14), np.full(10, 12)],
                         waiting=np.r_[np.full(10, 18), np.full(10, 20)], kv=0.98, preemptions=np.linspace(0, 12, 20)))
    result = analyze_sweep(runs, frames, max_num_seqs=128)
    assert result.knee_index == 2
    assert result.limit == "memory"
    assert "preemptions" in result.reason
    assert result.table["limit"].tolist()[-1] == "memory"


def test_compute():
    runs = summaries([100, 380, 700, 740, 750], [20, 24, 30, 70, 160])
    waiting_blips = np.zeros(20)
    waiting_blips[7] = 1  # a request arriving between two steps waits for one of them
    frames = [gauges(c, waiting_blips, 0.01 * c) for c in CONCURRENCY]
    result = analyze_sweep(runs, frames)
    assert result.knee_index == 2
    assert result.limit == "compute"
    assert result.table["running_max"].tolist() == [float(c) for c in CONCURRENCY]


def test_a_sweep_that_keeps_scaling_has_no_knee():
    runs = summaries([100, 390, 760, 1480, 2900], [20, 21, 23, 26, 31])
    result = analyze_sweep(runs, [gauges(c, 0, 0.01 * c) for c in CONCURRENCY])
    assert result.knee_index is None and result.limit is None
    assert result.top_limit == "compute"
    assert "not saturated" in result.reason


def test_find_knee_needs_both_a_flat_throughput_and_a_growing_ttft():
    assert find_knee([1, 2, 4], [100, 105, 106], [10, 11, 12]) is None  # flat, but latency did not suffer
    assert find_knee([1, 2, 4], [100, 180, 185], [10, 11, 40]) == 1
    with pytest.raises(ValueError, match="increasing"):
        find_knee([4, 2], [1, 2], [1, 2])


def test_find_knee_takes_the_gain_per_doubling_of_load():
    # 8 -> 32 users is two doublings: +15 % is about +7 % each, a flat curve with noise
    assert find_knee([1, 8, 32], [100, 700, 805], [20, 300, 1400]) == 1
    # the same +15 % over one doubling is still growth
    assert find_knee([1, 8, 16], [100, 700, 805], [20, 300, 1400]) is None


def test_without_a_knee_the_most_loaded_run_still_names_its_limit():
    # A noisy short sweep where throughput seemed to keep growing, yet requests queued at the cap of 8
    runs = summaries([100, 380, 700, 900, 1150], [20, 22, 25, 30, 36])
    frames = [gauges(min(c, 8), max(0, c - 8), 0.05 * min(c, 8)) for c in CONCURRENCY]
    result = analyze_sweep(runs, frames, max_num_seqs=8)
    assert result.knee_index is None and result.limit is None
    assert result.top_limit == "scheduler"
    assert "not saturated" in result.reason and "max-num-seqs" in result.reason


def test_classify_without_gauges_is_unknown():
    assert classify_limit(None).limit == "unknown"
    assert classify_limit(pd.DataFrame({"kv_cache_usage": [0.5]})).limit == "unknown"


def test_sweep_figures():
    runs, frames = scheduler_sweep()
    table = pd.DataFrame(runs)
    fig = plots.throughput_vs_load(table, knee=8)
    assert isinstance(fig, Figure)
    assert list(fig.axes[0].lines[0].get_xdata()) == CONCURRENCY
    assert list(fig.axes[0].lines[0].get_ydata()) == [100, 380, 700, 730, 740]
    fig = plots.latency_vs_load(table)
    assert len(fig.axes) == 2 and list(fig.axes[0].lines[1].get_ydata()) == [40, 44, 50, 800, 2400]  # p99 TTFT
    fig = plots.pareto_user_vs_total(table)
    assert list(fig.axes[0].lines[0].get_xdata()) == [100, 380, 700, 730, 740]
    fig = plots.server_timeseries(frames[-1])
    assert fig.axes[0].lines[0].get_ydata().max() == pytest.approx(0.4)


def test_cohorts_finishing_together_still_read_as_the_scheduler_cap():
    # Closed-loop users with equal output lengths finish in the same step: running is sampled at 8 only
    # half the time (0-3 in between) while 56 wait throughout.
    running = np.r_[np.full(10, 8), np.tile([0, 3], 5)]
    verdict = classify_limit(gauges(running, 56, 0.01), max_num_seqs=8)
    assert verdict.limit == "scheduler" and verdict.evidence["running_at_cap_share"] == 0.5


# ---------------------------------------------------------------- notebook 07's conclusions from the numbers

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE  # noqa: E402
from helpers.lessons.l07_saturation import (cap_conclusion, cap_doubling_outcome, client_lag_conclusion,  # noqa: E402
                                            control_conclusion, goodput_conclusion, lift_conclusion,
                                            pareto_fold_conclusion, saturation_caveat, slo_rule,
                                            steadiness_conclusion, waiting_if_cap)
from helpers.measure.saturation import relative_slos  # noqa: E402


def top_run(thr, ttft, tpot, goodput=0.0, good=0, completed=64, c=32):
    return {"concurrency": c, "output_throughput": thr, "median_ttft_ms": ttft, "median_tpot_ms": tpot,
            "request_goodput": goodput, "good_requests": good, "completed": completed}


def test_the_control_point_notices_a_noisy_machine():
    steady, noise = control_conclusion(70.0, 72.0)
    assert steady.verdict == SHOWN and "steady" in steady.text and noise == pytest.approx(0.10)
    noisy, noise = control_conclusion(12.6, 71.4)  # the busy-machine run: the cap is irrelevant at 1 user
    assert noisy.verdict == NOT_SHOWN and "noisy" in noisy.text and noise > 4


def test_a_tpot_that_falls_with_load_reads_as_a_machine_that_got_quieter():
    busy = [{"concurrency": c, "median_tpot_ms": t} for c, t in [(1, 66), (8, 65), (16, 22), (32, 23)]]
    c = steadiness_conclusion(busy, "cap 8")
    assert c.verdict == NOT_SHOWN and "fell from 66.0 ms at concurrency 1 to 22.0 ms at 16" in c.text
    assert steadiness_conclusion([{"concurrency": c, "median_tpot_ms": t} for c, t in [(1, 5), (8, 9), (32, 30)]],
                                 "cap 8") is None


def test_the_small_cap_reads_as_the_scheduler_limit_or_says_it_did_not():
    runs, frames = scheduler_sweep()
    shown = cap_conclusion(8, analyze_sweep(runs, frames, max_num_seqs=8), top_run(740, 1200, 18))
    assert shown.verdict == SHOWN and "limit 'scheduler'" in shown.text and "at most 8 ran and 24 waited" in shown.text
    compute = analyze_sweep(runs, [gauges(c, 0, 0.01 * c) for c in CONCURRENCY], max_num_seqs=64)
    missed = cap_conclusion(64, compute, top_run(740, 1200, 18))
    assert missed.verdict == NOT_SHOWN and "not the cap" in missed.text


def test_lifting_the_cap_is_judged_against_the_control_noise():
    runs, frames = scheduler_sweep()
    large = analyze_sweep(runs, [gauges(c, 0, 0.01 * c) for c in CONCURRENCY], max_num_seqs=64)
    small = top_run(700, 21000, 20)
    gained = lift_conclusion(64, large, small, top_run(1036, 2700, 40), noise_rel=0.10)
    assert gained.verdict == SHOWN and "1.48x" in gained.text
    # the same 1.48x on a machine whose control disagreed by 60% is within noise
    noisy = lift_conclusion(64, large, small, top_run(1036, 2700, 40), noise_rel=0.60)
    assert noisy.verdict == WITHIN_NOISE and "inside the +/-60% noise" in noisy.text
    lost = lift_conclusion(64, large, small, top_run(500, 2700, 90), noise_rel=0.10)
    assert lost.verdict == NOT_SHOWN and "throughput fell" in lost.text and "compute, not the cap" in lost.text


def test_goodput_slos_come_from_the_concurrency_1_run():
    slos = relative_slos({"median_ttft_ms": 40.0, "median_tpot_ms": 5.0}, ttft_x=10, tpot_x=4)
    assert slos == {"ttft": 400.0, "tpot": 20.0}
    assert "10x the median at concurrency 1 = 400 ms" in slo_rule(slos, 10, 4)
    with pytest.raises(ValueError, match="concurrency 1"):
        relative_slos({"median_ttft_ms": None, "median_tpot_ms": 5.0}, 10, 4)


def test_goodput_sentence_flips_with_the_numbers():
    slos = {"ttft": 400.0, "tpot": 20.0}
    more = goodput_conclusion(slos, top_run(700, 21000, 10, 0.2, 8), top_run(1000, 300, 15, 1.5, 60), (8, 64))
    assert more.verdict == SHOWN and "0.20 -> 1.50 requests/s" in more.text
    fewer = goodput_conclusion(slos, top_run(700, 300, 10, 1.5, 60), top_run(1000, 300, 45, 0.2, 8), (8, 64))
    assert fewer.verdict == NOT_SHOWN and "served fewer" in fewer.text and "median TPOT 45.0 ms against" in fewer.text
    # the busy-machine run: the raised cap's median TPOT was within its SLO, its median TTFT was not
    ttft_bound = goodput_conclusion({"ttft": 710.0, "tpot": 364.3}, top_run(34, 18875, 105, 0.07, 4, 32),
                                    top_run(99, 2738, 284, 0.0, 0, 32), (4, 32))
    assert ttft_bound.verdict == NOT_SHOWN and "(median TTFT 2,738 ms against" in ttft_bound.text
    none = goodput_conclusion(slos, top_run(700, 21000, 10), top_run(1000, 2700, 45), (8, 64))
    assert none.verdict == WITHIN_NOISE and "no request met both SLOs" in none.text
    assert "cap 8: median TTFT 21,000 ms" in none.text and "cap 64: median TTFT 2,700 ms and median TPOT 45.0 ms" in none.text


def test_client_lag_and_caveat():
    assert client_lag_conclusion(32, 2.0, 500).verdict == SHOWN
    assert "not negligible" in client_lag_conclusion(32, 80.0, 500).text
    assert saturation_caveat("cpu", 2).text.startswith("CPU vs GPU:") and "2 cores" in saturation_caveat("cpu", 2).text


class _FlagEngine:
    """Just the flags of an engine: set_flag records each restart."""

    def __init__(self, args: list[str]) -> None:
        self._args, self.restarts = list(args), []

    def args(self) -> list[str]:
        return list(self._args)

    def set_flag(self, flag: str, value) -> None:
        from helpers.core.vllm_args import with_flag

        self._args = list(with_flag(self._args, flag, value))
        self.restarts.append(value)


def _cap_sweep(monkeypatch, fail_at: int | None, restore: bool = True):
    from types import SimpleNamespace

    from helpers.measure import loadgen
    from helpers.core.vllm_args import flag_value

    def fake_sweep(settings, workload, concurrencies, **kwargs):
        if concurrencies == [fail_at]:
            raise KeyboardInterrupt
        return [f"run at {concurrencies[0]}"]

    monkeypatch.setattr(loadgen, "run_sweep", fake_sweep)
    monkeypatch.setattr(saturation, "analyze_results", lambda results, max_num_seqs: ("analysis", results))
    lab = SimpleNamespace(engine=_FlagEngine(["--max-model-len", "4096"]), settings=None)
    try:
        saturation.run_cap_sweep(lab, 8, [1, 4, 8], workload=None, restore=restore)
    except KeyboardInterrupt:
        pass
    return lab.engine, flag_value(lab.engine.args(), "--max-num-seqs")


@pytest.mark.parametrize("fail_at", [4, None])
def test_a_cap_sweep_puts_the_engine_back_on_its_flags_stopped_midway_or_not(monkeypatch, fail_at):
    engine, cap = _cap_sweep(monkeypatch, fail_at=fail_at)
    assert cap is None and engine.restarts == [8, None]  # back to the flag it started with


def test_two_sweeps_with_one_restart_fewer_end_on_the_flag_the_first_started_from(monkeypatch):
    from types import SimpleNamespace

    from helpers.measure import loadgen

    monkeypatch.setattr(loadgen, "run_sweep", lambda settings, workload, concurrencies, **kwargs: ["run"])
    monkeypatch.setattr(saturation, "analyze_results", lambda results, max_num_seqs: ("analysis", results))
    for provisioned in (None, "32"):  # the CPU lab's default, a cluster Deployment's provisioned cap
        engine = _FlagEngine(["--max-model-len", "4096"] + (["--max-num-seqs", provisioned] if provisioned else []))
        lab = SimpleNamespace(engine=engine, settings=None)
        baseline = saturation.current_cap(lab)
        saturation.run_cap_sweep(lab, 4, [1, 8], workload=None, restore=False)
        saturation.run_cap_sweep(lab, 64, [1, 8], workload=None, restore_to=baseline)
        assert saturation.current_cap(lab) == provisioned and engine.restarts == [4, 64, provisioned]


def test_a_cap_sweep_told_not_to_restore_stays_on_its_cap_unless_stopped_midway(monkeypatch):
    engine, cap = _cap_sweep(monkeypatch, fail_at=None, restore=False)
    assert cap == "8" and engine.restarts == [8]  # the next sweep sets its own cap: one restart fewer
    engine, cap = _cap_sweep(monkeypatch, fail_at=4, restore=False)
    assert cap is None and engine.restarts == [8, None]  # stopped midway: back on the flag it started with


def test_the_new_sweep_figures_keep_lines_and_legends_apart():
    runs, frames = scheduler_sweep()
    table = pd.DataFrame(runs)
    fig = plots.throughput_panels(table, knee=8)
    assert len(fig.axes) == 2  # tokens/s and requests/s on separate panels, never on twin axes
    assert list(fig.axes[0].lines[0].get_ydata()) == [100, 380, 700, 730, 740]
    assert list(fig.axes[1].lines[0].get_ydata()) == pytest.approx([v / 128 for v in (100, 380, 700, 730, 740)])
    fig = plots.server_gauges(frames[-1])
    assert len(fig.axes) == 2 and fig.axes[0].lines[0].get_ydata().max() == pytest.approx(0.4)
    for ax in fig.axes:  # the legend sits right of the axes, outside the data
        assert ax.get_legend()._bbox_to_anchor.bounds[0] > ax.get_window_extent().x1 - 1


def test_a_pareto_curve_that_folds_back_is_named_with_its_numbers():
    table = pd.DataFrame(summaries([100, 380, 700, 730, 740], [20, 22, 25, 400, 1200]))
    assert pareto_fold_conclusion(table).verdict == "shown"
    folded = pd.DataFrame(summaries([100, 380, 700, 500, 450], [20, 22, 25, 400, 1200]))
    c = pareto_fold_conclusion(folded)
    assert c.verdict == "not shown" and "from concurrency 8 to 16" in c.text and "700 -> 500" in c.text
    # a dip inside the noise is not a fold
    assert pareto_fold_conclusion(pd.DataFrame(summaries([100, 380, 700, 690, 740], [1] * 5))).verdict == "shown"


@pytest.mark.parametrize("users, cap, outcome, doubled", [(32, 4, "fewer would wait", 24), (32, 16, "none would wait", 0),
                                                          (8, 8, "none would wait", 0), (4, 8, "none would wait", 0)])
def test_doubling_the_cap_from_the_closed_loop_queue(users, cap, outcome, doubled):
    got, detail = cap_doubling_outcome(users, cap, waited_max=max(0, users - cap))
    assert got == outcome and f"behind {2 * cap}: {doubled} would wait" in detail
    assert detail.startswith("in a closed loop every user beyond the cap waits")  # the reason, in ANSWERS
    assert waiting_if_cap(users, cap) == max(0, users - cap)


# ---------------------------------------------------------------- the talk's price curve and batching on a GPU

from helpers.lessons.l07_saturation import (PUBLISHED_BATCHING, TALK_PRICES, batching_beside_gpu,  # noqa: E402
                                            batching_conclusion, price_gap, price_gap_conclusions)
from helpers.planning import token_price  # noqa: E402


def test_the_talks_case_prints_ideal_adjusted_and_talk_with_every_terms_share():
    config = token_price.reference_config("Llama-3.3-70B")
    model = token_price.model_on_gpu("Llama-3.3-70B bf16", config)
    prices, gap = price_gap(model, config, "H100 SXM", 8, 1024, 1024, [10, 20, 30])
    assert list(gap["target_tpot_ms"]) == [10, 20, 30] and list(gap["reference_usd"]) == [0.71, 0.50, 0.46]
    assert gap["ideal_usd"].iloc[0] == pytest.approx(0.352, abs=0.002)  # the roofline of the issue: nearly flat
    assert set(prices["curve"]) == {"ideal", "+ bandwidth", "+ compute", "+ all-reduce", "+ overhead"}
    steeper, *lines, explained = price_gap_conclusions(gap)
    assert steeper.verdict in (SHOWN, NOT_SHOWN) and explained.verdict in (SHOWN, NOT_SHOWN)
    assert len(lines) == 3 and all("bandwidth" in line.text for line in lines)
    assert set(TALK_PRICES) == {10, 20, 30}


def test_batching_beside_a_gpu_reads_this_run_the_roofline_and_the_published_figure():
    sweep = pd.DataFrame({"concurrency": [1, 8, 32], "median_tpot_ms": [30.0, 60.0, 200.0],
                          "output_throughput": [30.0, 120.0, 150.0]})
    frame = batching_beside_gpu(sweep, "H100 SXM")
    assert list(frame["throughput_gain"].round(2))[::2] == [5.0, round((32 / 25) / (1 / 19), 2)]
    assert frame["throughput_gain"].iloc[1] > 25  # memory bound at batch 32: almost the whole batch is gained
    assert "not from this run" in frame["setup"].iloc[2] and PUBLISHED_BATCHING["source"] in frame["setup"].iloc[2]
    text = batching_conclusion(frame).text
    assert "32x the users bought 5.0x" in text and "shows 24x" in text


def test_the_talks_case_says_when_the_model_does_not_fit_and_always_prices_the_talks_targets():
    config = token_price.reference_config("Llama-3.3-70B")
    model = token_price.model_on_gpu("Llama-3.3-70B bf16", config)
    with pytest.raises(ValueError, match="raise TALK_NUM_GPUS"):
        price_gap(model, config, "H100 SXM", 1, 1024, 1024)
    prices, gap = price_gap(model, config, "H100 SXM", 8, 1024, 1024, [15])
    assert set(prices["target_tpot_ms"]) == {10, 15, 20, 30} and list(gap["target_tpot_ms"]) == [10, 20, 30]
