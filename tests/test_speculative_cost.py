"""Notebook 06's cost side (c, E / (1 + k c), the talk's example, batching) and losslessness test (a permutation
G-test with its power shown), on fixed synthetic numbers that go both ways."""

from types import SimpleNamespace

import pandas as pd
import pytest

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE
from helpers.lessons.l06 import (BASELINE, TALK_EXAMPLE, arithmetic_sentence, arithmetic_table, batching_conclusion,
                                 cost_conclusion, cost_table, gpu_beside_cpu, lossless_sampler, lossless_tests,
                                 permutation_test, run_methods, speedups, step_arithmetic)
from helpers.lessons.l06.lossless import SAMPLE_NAMES, lossless_conclusion
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


class _FakeCompletions:
    def __init__(self):
        self.calls = []

    def create(self, **kwargs):
        self.calls.append(kwargs)
        choice = SimpleNamespace(logprobs=SimpleNamespace(tokens=["A", "x"]), text="Ax")
        return SimpleNamespace(choices=[choice] * kwargs["n"])


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
