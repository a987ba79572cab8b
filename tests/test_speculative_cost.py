"""Notebook 06's cost side (c, E / (1 + k c), the talk's example, batching) and losslessness test (a permutation
G-test with its power shown), on fixed synthetic numbers that go both ways."""

from types import SimpleNamespace

import pandas as pd
import pytest

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE
from helpers.lessons.l06 import (BASELINE, TALK_EXAMPLE, arithmetic_sentence, arithmetic_table, batching_conclusion,
                                 cost_conclusion, cost_table, gpu_beside_cpu, lossless_sampler, lossless_tests,
                                 permutation_test, run_methods, speedups, step_arithmetic, talk_speedups)
from helpers.lessons.l06.lossless import (FIXED_SAMPLE, SAMPLE_NAMES, format_p, lossless_conclusion,
                                         lossless_pair)
from helpers.planning.acceptance import expected_accepted_length, first_guess_acceptance, speculative_speedup

ALIGNED, MISALIGNED = "draft k=3", "untrained k=3"


def test_the_talks_example_is_80_against_45_ms():
    r = step_arithmetic(**TALK_EXAMPLE)
    assert (r["plain_ms"], r["speculative_ms"], r["c"]) == (80.0, 45.0, 0.25)
    assert r["speedup_if_all_accepted"] == pytest.approx(80 / 45)
    table = arithmetic_table(10.0, 0.5, 3)
    assert list(table.case) == ["the talk", "this run"] and table.speculative_ms.iloc[1] == pytest.approx(3 * 5 + 10)
    assert "4 x 20.0 ms = 80.0 ms" in arithmetic_sentence(table) and len(arithmetic_table(None, 0.5, 3)) == 1


def test_the_speedup_formula_divides_tokens_per_step_by_the_steps_cost():
    assert speculative_speedup(2.6, 3, 0.2) == pytest.approx(2.6 / 1.6)
    assert speculative_speedup(1.0, 3, 0.0) == 1.0
    with pytest.raises(ValueError):
        speculative_speedup(2.0, 3, -0.1)


def _runs(concurrency, base_tpot, aligned_tpot, misaligned_tpot, a=0.6, tok_s=(100.0, 101.0)):
    """Baseline, aligned and misaligned rows (two repeats each) at one concurrency."""
    rows = []
    for config, tpot, length, rates in ((BASELINE, base_tpot, None, None),
                                        (ALIGNED, aligned_tpot, 1 + a + a * a * 0.9 + a ** 3 * 0.8, [a, a * a * 0.9, a ** 3 * 0.8]),
                                        (MISALIGNED, misaligned_tpot, 1.0, [0.0, 0.0, 0.0])):
        for v in tok_s:
            rows.append({"config": config, "concurrency": concurrency, "output_tok_s": v * base_tpot / tpot,
                         "mean_tpot_ms": tpot, "acceptance_rate": None if rates is None else sum(rates) / 3,
                         "mean_acceptance_length": length, "tokens_per_chunk": length or 1.0,
                         "spec_drafts": None if rates is None else 100, "per_position_acceptance": rates})
    return pd.DataFrame(rows)


def _costs(frames):
    runs = pd.concat(frames, ignore_index=True)
    table = speedups(runs, k={ALIGNED: 3, MISALIGNED: 3})
    return runs, cost_table(table, runs, ALIGNED, MISALIGNED, 3)


def test_c_comes_from_the_untrained_draft_and_the_prediction_is_checked_both_ways():
    # a speculative step costs 1 + 3 x 0.2 = 1.6 target steps (misaligned TPOT 16 vs 10 ms, one token per step)
    runs, costs = _costs([_runs(1, 10.0, 16.0 / 2.2, 16.0)])
    row = costs.iloc[0].to_dict()
    assert row["c"] == pytest.approx(0.2) and row["a_first_guess"] == pytest.approx(0.6)
    assert first_guess_acceptance(runs, ALIGNED, 1) == pytest.approx(0.6)
    assert row["predicted_speedup"] == pytest.approx(expected_accepted_length(0.6, 3) / 1.6)
    assert row["measured_speedup"] == pytest.approx(2.2 / 1.6)
    good = cost_conclusion(row)
    assert good.verdict == SHOWN and "c = 0.20" in good.text and "(E - 1) / k" in good.text
    # the trained draft's step measured far slower than the untrained one's: the prediction misses and says why
    _, costs = _costs([_runs(1, 10.0, 30.0, 16.0)])
    bad = cost_conclusion(costs.iloc[0].to_dict())
    assert bad.verdict == NOT_SHOWN and "a step of the untrained draft cost 1.60 target steps" in bad.text
    assert cost_conclusion({"concurrency": 1, "predicted_speedup": None}).verdict == WITHIN_NOISE
    # the untrained draft's step measured cheaper than a plain one: a busy machine, not a test of the cost model
    _, busy = _costs([_runs(1, 20.0, 4.0, 5.0)])
    assert not busy.consistent.iloc[0] and cost_conclusion(busy.iloc[0].to_dict()).verdict == WITHIN_NOISE
    _, busy_batch = _costs([_runs(1, 20.0, 4.0, 5.0), _runs(8, 10.0, 14.0, 30.0)])
    assert "no trend can be read" in batching_conclusion(busy_batch).text


def test_batching_erodes_the_gain_or_not_from_the_numbers():
    _, eroding = _costs([_runs(1, 10.0, 7.0, 16.0), _runs(8, 10.0, 14.0, 30.0)])
    c = batching_conclusion(eroding)
    assert c.verdict == SHOWN and "concurrency 1 -> 8" in c.text and "stopped paying from concurrency 8" in c.text
    _, growing = _costs([_runs(1, 10.0, 14.0, 30.0), _runs(8, 10.0, 7.0, 16.0)])
    assert batching_conclusion(growing).verdict == NOT_SHOWN
    _, flat = _costs([_runs(1, 10.0, 7.0, 16.0), _runs(8, 10.0, 7.1, 16.0)])
    assert batching_conclusion(flat).verdict == WITHIN_NOISE
    assert batching_conclusion(flat.iloc[:1]).verdict == WITHIN_NOISE


def test_the_gpu_row_is_labelled_not_from_this_run():
    table = gpu_beside_cpu({"concurrency": 1, "measured_speedup": 0.8, "predicted_speedup": 0.9}, "cpu")
    assert list(table["speed-up"][:2]) == ["0.80x", "0.90x"]
    assert table["where from"].iloc[2].startswith("not from this run: vLLM blog") and "2024-10-17" in table["where from"].iloc[2]


def _seqs(counts: dict[tuple[str, ...], int]) -> list[tuple[str, ...]]:
    return [s for s, n in counts.items() for _ in range(n)]


SAME = _seqs({("A", "x", "p"): 120, ("A", "y", "p"): 60, ("A", "y", "q"): 20})
SHIFTED = _seqs({("A", "x", "p"): 60, ("A", "y", "p"): 60, ("A", "y", "q"): 80})
FIRST_ONLY = _seqs({("B", "x", "p"): 120, ("B", "y", "p"): 60, ("B", "y", "q"): 20})  # only the prefill token differs


def test_the_permutation_test_rejects_a_shift_and_not_the_same_counts():
    g, p = permutation_test(SAME, SHIFTED, permutations=500)
    assert g > 30 and p < 0.01
    assert permutation_test(SAME, list(reversed(SAME)), permutations=500) == (0.0, 1.0)
    assert permutation_test(SAME, FIRST_ONLY, permutations=500)[1] == 1.0  # the first token is not tested


def test_the_losslessness_verdict_needs_power_and_no_false_alarm_first():
    assert lossless_conclusion(0.4, 0.001, 0.5, 600).verdict == SHOWN
    assert lossless_conclusion(0.001, 0.001, 0.5, 600, shift="token '.'").verdict == NOT_SHOWN
    no_power = lossless_conclusion(0.4, 0.3, 0.5, 600)
    assert no_power.verdict == WITHIN_NOISE and "no power" in no_power.text
    assert lossless_conclusion(0.4, 0.001, 0.001, 600).verdict == WITHIN_NOISE
    samples = dict(zip(SAMPLE_NAMES, (SAME, SAME[::-1], SHIFTED, SAME[::2] + SAME[1::2])))
    assert lossless_tests(samples, permutations=300).verdict == SHOWN
    samples[SAMPLE_NAMES[3]] = SHIFTED
    shifted = lossless_tests(samples, permutations=300)
    assert shifted.verdict == NOT_SHOWN and "token 'p' at position 3 in 180 of 200 continuations without speculation against 120 of 200" in shifted.text
    assert lossless_tests({SAMPLE_NAMES[0]: SAME}).verdict == WITHIN_NOISE


def test_a_p_value_at_the_permutation_floor_is_printed_as_a_bound():
    assert format_p(1 / 2001, 2000) == "p <= 1/2001" and format_p(0.00049, 2000) == "p <= 1/2001"
    assert format_p(2 / 2001, 2000) == "p = 0.001" and format_p(0.5) == "p = 0.5"
    _, p = permutation_test(SAME, SHIFTED, permutations=300)
    assert p == 1 / 301 and format_p(p, 300) == "p <= 1/301"
    text = lossless_conclusion(1 / 2001, 1 / 2001, 0.5, 600, p_first=0.4, p_first_hotter=1 / 2001).text
    assert "with vs without speculation p <= 1/2001; temperature x1.2 vs x1 p <= 1/2001" in text
    assert "p = 0.0005" not in text and "2000 permutations" in text


def test_position_1_is_a_negative_control_with_its_own_power_check():
    # position 1 differs: the engines differ in more than speculation, whatever the later positions say
    moved = lossless_conclusion(0.001, 0.001, 0.5, 600, p_first=0.001, p_first_hotter=0.001)
    assert moved.verdict == WITHIN_NOISE and "position 1, which the target samples alone, differed too" in moved.text
    rejected = lossless_conclusion(0.001, 0.001, 0.5, 600, p_first=0.6, p_first_hotter=0.001)
    assert rejected.verdict == NOT_SHOWN and "position 1 (the control) with vs without p = 0.6, x1.2 vs x1 p = 0.001" in rejected.text
    assert "one that varies from run to run" in rejected.text and "weak evidence" not in rejected.text
    weak = lossless_conclusion(0.001, 0.001, 0.5, 600, p_first=0.6, p_first_hotter=0.3)
    assert weak.verdict == NOT_SHOWN and "could not tell x1.2 apart, so its not differing is weak evidence" in weak.text
    # only the first token moved: the control catches it, the verified positions do not
    samples = dict(zip(SAMPLE_NAMES, (SAME, SAME[::-1], SHIFTED, FIRST_ONLY)))
    assert lossless_tests(samples, permutations=300).verdict == WITHIN_NOISE


def test_passing_says_a_per_position_test_cannot_show_the_joint_distribution_unchanged():
    passed = lossless_conclusion(0.4, 0.001, 0.5, 600, p_first=0.5, p_first_hotter=0.001)
    assert passed.verdict == SHOWN
    assert "a per-position test can reject, but passing it cannot show the joint distribution" in passed.text


HOT_FIRST = _seqs({("B", "x", "p"): 60, ("A", "y", "p"): 60, ("A", "y", "q"): 80})  # x1.2: position 1 moves too


def test_the_pair_puts_the_stock_and_the_fixed_engine_side_by_side():
    samples = dict(zip(SAMPLE_NAMES, (SAME, SAME[::-1], HOT_FIRST, SHIFTED)))
    samples[FIXED_SAMPLE] = SAME[::2] + SAME[1::2]
    counters = {SAMPLE_NAMES[3]: {"drafts": 500.0, "accepted_tokens": 900.0, "acceptance_rate": 0.6},
                FIXED_SAMPLE: {"drafts": 520.0, "accepted_tokens": 950.0, "acceptance_rate": 0.61}}
    conclusions, table = lossless_pair(samples, counters, permutations=300)
    assert [c.verdict for c in conclusions] == [SHOWN, SHOWN, SHOWN, SHOWN]
    assert "vllm-project/vllm/issues/55005" in conclusions[0].expectation
    assert "vllm-project/vllm/pull/55006" in conclusions[1].expectation
    assert "uninitialised memory" in conclusions[0].text and "p <= 1/301" in conclusions[0].text
    assert ("stock 500 drafts, 900 draft tokens accepted (60.0%); fixed 520 drafts, 950 draft tokens accepted (61.0%)"
            in conclusions[3].text)
    assert list(table.engine) == ["stock", "vllm#55006 applied"] and list(table.verdict) == [NOT_SHOWN, SHOWN]
    assert table["p, positions 2 on"].iloc[0] == "p <= 1/301" and list(table.drafts) == [500.0, 520.0]
    # the fix did not help, position 1 moved in one run, no draft was accepted: each check says so
    samples[FIXED_SAMPLE] = SHIFTED
    assert lossless_pair(samples, counters, permutations=300)[0][1].verdict == NOT_SHOWN
    samples[FIXED_SAMPLE] = FIRST_ONLY
    assert lossless_pair(samples, counters, permutations=300)[0][2].verdict == NOT_SHOWN
    counters[FIXED_SAMPLE] = {"drafts": 0.0, "accepted_tokens": 0.0, "acceptance_rate": None}
    assert lossless_pair(samples, counters, permutations=300)[0][3].verdict == NOT_SHOWN
    # a stock engine that passes (a GPU build, Triton-CPU) is said to be right already; no fixed run is not a pass
    samples[SAMPLE_NAMES[3]] = SAME[::-1]
    del samples[FIXED_SAMPLE]
    stock, fixed, *_ = lossless_pair(samples, permutations=300)[0]
    assert stock.verdict == NOT_SHOWN and "the stock engine is already right" in stock.text
    assert fixed.verdict == WITHIN_NOISE and "was not run" in fixed.text


class _FakeCompletions:
    def __init__(self):
        self.calls = []

    def create(self, **kwargs):
        self.calls.append(kwargs)
        choice = SimpleNamespace(logprobs=SimpleNamespace(tokens=["A", "x"]), text="Ax")
        return SimpleNamespace(choices=[choice] * kwargs["n"])


def test_the_sampler_seeds_each_sample_apart_and_counts_the_drafts_of_each_speculative_one(monkeypatch):
    import helpers.measure.server_metrics as server_metrics

    snapshots = iter(range(10))
    monkeypatch.setattr(server_metrics, "scrape", lambda url: next(snapshots))
    monkeypatch.setattr(server_metrics, "window", lambda before, after: {
        "spec_decode_num_drafts": 10.0 * after, "spec_decode_num_accepted_tokens": 5.0 * after,
        "spec_decode_acceptance_rate": 0.5})
    completions, store, counters = _FakeCompletions(), {}, {}
    lab = SimpleNamespace(model="m", client=SimpleNamespace(completions=completions),
                          settings=SimpleNamespace(metrics_url="http://x/metrics"))
    sample = lossless_sampler(lab, store, BASELINE, ALIGNED, "p", 5, fixed="fixed", seed=100, counters=counters)
    for name in (BASELINE, ALIGNED, "fixed"):
        sample(name)
    assert [c["seed"] for c in completions.calls] == [100, 105, 110, 115, 115]  # the stock and fixed draws alike
    assert list(store) == [*SAMPLE_NAMES, FIXED_SAMPLE]
    assert counters == {SAMPLE_NAMES[3]: {"drafts": 10.0, "accepted_tokens": 5.0, "acceptance_rate": 0.5},
                        FIXED_SAMPLE: {"drafts": 30.0, "accepted_tokens": 15.0, "acceptance_rate": 0.5}}


def test_run_methods_starts_a_method_with_its_environment_and_the_others_without(monkeypatch):
    import helpers.lessons.l06.runs as runs_module
    from helpers.core.vllm_args import EngineConfig, flag_value

    state = {"config": EngineConfig(model="m", served_name="m", args=("--enforce-eager",), env=(("A", "1"),))}
    applied = []

    def apply(config):
        applied.append((flag_value(config.args, "--speculative-config"), dict(config.env)))
        state["config"] = config

    engine = SimpleNamespace(config=lambda: state["config"], args=lambda: list(state["config"].args), apply=apply,
                             set_flag=lambda flag, value: apply(state["config"].__class__(
                                 **{**state["config"].__dict__, "args": runs_module.with_flag(state["config"].args, flag, value)})))
    monkeypatch.setattr(runs_module, "measure_speculation",
                        lambda lab, name, cs, w, r: [{"config": name, "concurrency": 1, "output_tok_s": 1.0}])
    run_methods(SimpleNamespace(engine=engine), {"k=1": "{1}", "fixed": "{3}"}, [1], None, repeats=1,
                env={"fixed": (("FIX", "1"),)})
    assert applied == [("{1}", {"A": "1"}), ("{3}", {"A": "1", "FIX": "1"}), (None, {"A": "1"})]
    assert state["config"].args == ("--enforce-eager",)


def _spec_engine():
    """An engine whose --speculative-config is set by set_flag, each change recorded as a restart."""
    flags: dict[str, str | None] = {"--speculative-config": None}
    restarts: list[str | None] = []

    def set_flag(flag, value):
        flags[flag] = value
        restarts.append(value)
    engine = SimpleNamespace(args=lambda: [a for k, v in flags.items() if v for a in (k, v)], set_flag=set_flag)
    return engine, flags, restarts


@pytest.mark.parametrize("repeats", [1, 2, 3])
def test_the_method_grid_completes_round_one_then_runs_back_to_the_baseline_with_no_restart_wasted(monkeypatch,
                                                                                                   repeats):
    import pandas as pd

    import helpers.lessons.l06.runs as runs_module
    from helpers.lessons.l06 import complete_rounds

    engine, flags, restarts = _spec_engine()
    measured = []
    monkeypatch.setattr(runs_module, "measure_speculation", lambda lab, name, cs, w, r: measured.append(
        (name, flags["--speculative-config"])) or [{"config": name, "concurrency": 1, "output_tok_s": 1.0}])
    methods = {BASELINE: None, "aligned": "{a}", "misaligned": "{m}", "ngram": "{n}"}
    done = pd.DataFrame([{"config": BASELINE, "concurrency": 1, "output_tok_s": 1.0, "repeat": 1},
                         {"config": "aligned", "concurrency": 1, "output_tok_s": 1.0, "repeat": 1}])
    grid = complete_rounds(SimpleNamespace(engine=engine), methods, done, [1], None, repeats, 1)
    assert all(config == methods[name] for name, config in measured)  # each measured on its own engine
    assert flags["--speculative-config"] is None  # left on the baseline
    assert grid.groupby("config").size().to_dict() == {name: repeats for name in methods}
    rounds = [["misaligned", "ngram"], ["ngram", "misaligned", "aligned", BASELINE],
              [BASELINE, "aligned", "misaligned", "ngram"]]
    assert [name for name, _ in measured] == [n for r in rounds[:repeats] for n in r]
    # round 1's two, then from ngram (no restart) back to the baseline it measures last (no restart to go back);
    # a third round starts on that baseline and goes back at its end
    assert restarts == {1: ["{m}", "{n}", None], 2: ["{m}", "{n}", "{m}", "{a}", None],
                        3: ["{m}", "{n}", "{m}", "{a}", None, "{a}", "{m}", "{n}", None]}[repeats]


def test_a_failed_method_puts_the_engine_back_even_when_asked_to_stay(monkeypatch):
    import helpers.lessons.l06.runs as runs_module

    engine, flags, _ = _spec_engine()

    def measure(lab, name, cs, w, r):
        if name == "ngram":
            raise RuntimeError("the engine died")
        return [{"config": name, "concurrency": 1, "output_tok_s": 1.0}]
    monkeypatch.setattr(runs_module, "measure_speculation", measure)
    with pytest.raises(RuntimeError):
        run_methods(SimpleNamespace(engine=engine), {"aligned": "{a}", "ngram": "{n}"}, [1], None, 1, 1, back=False)
    assert flags["--speculative-config"] is None
    run_methods(SimpleNamespace(engine=engine), {"aligned": "{a}"}, [1], None, 1, 1, back=False)
    assert flags["--speculative-config"] == "{a}"  # stays on the last method for the caller to go on from


def test_the_sampler_takes_three_samples_on_the_baseline_and_one_on_the_draft():
    completions, store = _FakeCompletions(), {}
    lab = SimpleNamespace(model="m", client=SimpleNamespace(completions=completions))
    sample = lossless_sampler(lab, store, BASELINE, ALIGNED, "The weather in", 5, max_tokens=3, temperature=0.8)
    for name in (BASELINE, "other", ALIGNED):
        sample(name)
    assert list(store) == list(SAMPLE_NAMES) and store[SAMPLE_NAMES[3]] == [("A", "x")] * 5
    assert [c["temperature"] for c in completions.calls] == pytest.approx([0.8, 0.8, 0.96, 0.8])
    assert {c["n"] for c in completions.calls} == {5} and {c["max_tokens"] for c in completions.calls} == {3}


def test_the_first_round_hook_runs_once_per_method_while_its_engine_is_up(monkeypatch):
    import helpers.lessons.l06.runs as runs_module

    flags: dict[str, str | None] = {"--speculative-config": None}
    engine = SimpleNamespace(args=lambda: [a for k, v in flags.items() if v for a in (k, v)],
                             set_flag=lambda flag, value: flags.__setitem__(flag, value))
    monkeypatch.setattr(runs_module, "measure_speculation",
                        lambda lab, name, cs, w, r: [{"config": name, "concurrency": 1, "output_tok_s": 1.0}])
    seen = []
    frame, _ = run_methods(SimpleNamespace(engine=engine), {BASELINE: None, ALIGNED: "{}"}, [1], None, repeats=2,
                           first_round=lambda name: seen.append((name, flags["--speculative-config"])))
    assert seen == [(BASELINE, None), (ALIGNED, "{}")] and len(frame) == 4 and flags["--speculative-config"] is None


@pytest.mark.parametrize("example", [TALK_EXAMPLE, {"target_step_ms": 10.0, "draft_ms_per_guess": 1.0, "k": 3,
                                                     "verify_ms": 12.0}])
def test_the_three_readings_of_one_example_each_follow_from_its_numbers(example):
    (k_only, _), (with_own, _), (draft_only, why) = talk_speedups(**example)
    t, d, k, v = example["target_step_ms"], example["draft_ms_per_guess"], example["k"], example["verify_ms"]
    assert k_only == pytest.approx(k * t / (k * d + v)) and with_own == pytest.approx((k + 1) * t / (k * d + v))
    c_width = ((k * d + v) / t - 1) / k  # c carrying the verification's extra width gives the second reading
    assert (k + 1) / (1 + k * c_width) == pytest.approx(with_own)
    assert draft_only == pytest.approx((k + 1) / (1 + k * d / t)) and f"not {v:.0f} ms" in why
    assert k_only < with_own < draft_only  # a verification dearer than a plain step: the draft-only c flatters


def test_the_talks_example_reads_as_the_three_figures_it_was_quoted_with():
    assert [round(x, 2) for x, _ in talk_speedups(**TALK_EXAMPLE)] == [1.78, 2.22, 2.5]
