"""The --speculative-config builder (measurement runs against the real engine in notebook 06)."""

import json

import pytest

from helpers.core.settings import models_dir
from helpers.lessons.l06 import spec_config


def test_ngram_gets_prompt_lookup_defaults():
    config = json.loads(spec_config("ngram", 3))
    assert config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def test_a_shipped_draft_resolves_to_its_directory_and_a_hub_id_stays():
    assert json.loads(spec_config("draft_model", 2, model="tiny-agent"))["model"] == str(models_dir() / "tiny-agent")
    assert json.loads(spec_config("draft_model", 2, model="Qwen/Qwen3-0.6B"))["model"] == "Qwen/Qwen3-0.6B"


@pytest.mark.parametrize("args, message", [(("draft_model", 2), "needs model"), (("eagle", 2), "unknown method"),
                                           (("ngram", 0), ">= 1")])
def test_bad_configs_say_what_to_change(args, message):
    with pytest.raises(ValueError, match=message):
        spec_config(*args)


# ---------------------------------------------------------------- conclusions from the numbers

import pandas as pd  # noqa: E402

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE  # noqa: E402
from helpers.lessons.l06 import (BASELINE, acceptance_conclusion, k_conclusion, method_conclusion, per_k,  # noqa: E402
                                 speculation_caveat, speedups, trend_conclusion)

ALIGNED = "draft k=3"


def runs(base_tok_s, spec_tok_s, concurrency=1, base_tpot=10.0, spec_tpot=10.0, acceptance=0.6, length=2.8):
    """A run table: one row per repeat of the baseline and of one speculative method at one concurrency."""
    rows = [{"config": BASELINE, "concurrency": concurrency, "output_tok_s": v, "mean_tpot_ms": base_tpot,
             "acceptance_rate": None, "mean_acceptance_length": None, "tokens_per_chunk": 1.0} for v in base_tok_s]
    rows += [{"config": ALIGNED, "concurrency": concurrency, "output_tok_s": v, "mean_tpot_ms": spec_tpot,
              "acceptance_rate": acceptance, "mean_acceptance_length": length, "tokens_per_chunk": length}
             for v in spec_tok_s]
    return pd.DataFrame(rows)


def test_a_speedup_beyond_the_spread_is_shown():
    row = speedups(runs([100, 102], [150, 148], spec_tpot=6.7), k={ALIGNED: 3}).iloc[0].to_dict()
    assert row["verdict"] == "better" and row["step_cost_x"] == pytest.approx(6.7 * 2.8 / 10)
    c = method_conclusion(row, expect="better")
    assert c.verdict == SHOWN and "faster" in c.text and "1.48x" in c.text


def test_a_slowdown_says_why_from_the_step_cost_and_acceptance():
    row = speedups(runs([100, 102], [40, 42], spec_tpot=25.0, acceptance=0.2, length=1.6),
                   k={ALIGNED: 3}).iloc[0].to_dict()
    c = method_conclusion(row, expect="better")
    assert c.verdict == NOT_SHOWN and "slower" in c.text
    assert "one speculative step took 4.0x a plain step" in c.text and "only 20% of the guesses" in c.text
    assert "each guessed token cost about 1.00 of a target step" in c.text


def test_a_difference_inside_the_spread_is_no_measurable_difference():
    row = speedups(runs([100, 120], [112, 104])).iloc[0].to_dict()
    c = method_conclusion(row, expect="better")
    assert c.verdict == WITHIN_NOISE and "no measurable difference" in c.text
    assert "faster" not in c.text and "slower" not in c.text


def _row(c, speedup, noise=0.05, step=None):
    return {"concurrency": c, "speedup": speedup, "noise_rel": noise, "step_cost_x": step}


def test_the_trend_sentence_follows_the_numbers():
    shrinks = trend_conclusion("aligned", _row(1, 1.3), _row(8, 0.9))
    assert shrinks.verdict == SHOWN and "shrinks" in shrinks.text
    # the busy-machine run: 0.17x -> 0.59x must not read as "shrinks"
    grows = trend_conclusion("aligned", _row(1, 0.17, step=5.0), _row(8, 0.59, step=2.0))
    assert grows.verdict == NOT_SHOWN and "shrinks" not in grows.text
    assert "grew" in grows.text and "5.0x a plain step at concurrency 1 but 2.0x at 8" in grows.text
    flat = trend_conclusion("aligned", _row(1, 1.0, noise=0.1), _row(8, 1.05, noise=0.1))
    assert flat.verdict == WITHIN_NOISE and "about the same" in flat.text


def test_acceptance_aligned_above_misaligned_or_not():
    assert acceptance_conclusion([0.6, 0.62], [0.05, 0.04]).verdict == SHOWN
    flipped = acceptance_conclusion([0.05, 0.04], [0.6, 0.62])
    assert flipped.verdict == NOT_SHOWN and "untrained draft was accepted more" in flipped.text
    assert "Aligned draft acceptance 4.5% vs misaligned 61.0%" in flipped.text
    assert acceptance_conclusion([0.5, 0.52], [0.51, 0.5]).verdict == WITHIN_NOISE


def test_the_k_check_reads_the_conditional_rates_which_can_fall_or_not():
    falling = pd.DataFrame({"k": [1, 3, 5], "output_tok_s": [110, 120, 100], "acceptance_rate": [0.8, 0.6, 0.4],
                            "mean_acceptance_length": [1.8, 2.8, 3.0],
                            "conditional": [[0.8], [0.8, 0.7, 0.6], [0.8, 0.7, 0.6, 0.5, 0.5]]})
    c = k_conclusion(falling, [100, 100])
    assert c.verdict == SHOWN and "best k=3" in c.text and "At k=5" in c.text and "80%, 70%, 60%, 50%, 50%" in c.text
    # the plain per-position rates fall in every run (a guess counts only after the earlier ones were kept); the
    # conditional ones can rise, and then the check says so
    rising = falling.assign(conditional=[[0.5], [0.5, 0.8, 0.9], [0.5, 0.8, 0.9, 0.9, 0.95]])
    assert k_conclusion(rising, [100, 100]).verdict == NOT_SHOWN
    flat = falling.assign(conditional=[[0.6], [0.6, 0.62, 0.6], [0.6, 0.61, 0.6, 0.62, 0.58]])
    assert k_conclusion(flat, [100, 100]).verdict == WITHIN_NOISE
    only_k1 = falling.iloc[:1]
    assert k_conclusion(only_k1, [100, 100]).verdict == WITHIN_NOISE and "needs k >= 2" in k_conclusion(only_k1, [100]).text
    assert k_conclusion(falling.drop(columns="conditional"), [100, 100]).verdict == WITHIN_NOISE


def test_per_k_pools_the_conditional_rates_over_runs_by_drafts():
    runs = pd.DataFrame([{"config": "d k=3", "concurrency": 1, "output_tok_s": 10.0, "acceptance_rate": 0.5,
                          "mean_acceptance_length": 2.0, "spec_drafts": drafts, "per_position_acceptance": rates}
                         for drafts, rates in ((100, [0.8, 0.4, 0.2]), (300, [0.6, 0.3, 0.3]))])
    row = per_k(runs, {3: "d k=3"}, 1).iloc[0]
    # pooled per position: 0.65, 0.325, 0.275; conditional: 0.65, 0.5, 0.846
    assert row.conditional == pytest.approx([0.65, 0.5, 0.846], abs=1e-3)


def test_the_cpu_caveat_is_labelled_and_carries_the_measured_draft_cost():
    costly = speculation_caveat("cpu", draft_cost_x=0.9).text
    assert costly.startswith("CPU vs GPU:") and "about 0.90 of a target step" in costly and "rarely pays" in costly
    # a draft measured far cheaper than the target: the sentence must not claim it costs as much
    cheap = speculation_caveat("cpu", draft_cost_x=0.08).text
    assert "only 0.08 of a target step" in cheap and "rarely pays" not in cheap and "could pay even on this CPU" in cheap
    assert speculation_caveat("gpu").text.startswith("GPU:")


def test_the_summary_covers_every_method_the_trend_acceptance_k_and_the_caveat():
    from helpers.lessons.l06 import mean_runs, per_k, speculation_conclusions

    def method(name, tok_s, acceptance, c):
        return [{"config": name, "concurrency": c, "output_tok_s": v, "mean_tpot_ms": 1000 / v,
                 "acceptance_rate": acceptance, "mean_acceptance_length": None if acceptance is None else 1 + 3 * acceptance,
                 "tokens_per_chunk": 1.0} for v in tok_s]

    rows = []
    for c, base, good, bad in [(1, [100, 101], [40, 42], [30, 31]), (8, [400, 404], [240, 236], [100, 98])]:
        rows += method(BASELINE, base, None, c) + method("aligned", good, 0.5, c) + method("misaligned", bad, 0.05, c)
    runs_ = pd.DataFrame(rows)
    table = speedups(runs_, k={"aligned": 3, "misaligned": 3})
    k_rows = per_k(runs_, {3: "aligned"}, 1)
    assert k_rows.output_tok_s.tolist() == [41.0] and len(mean_runs(runs_)) == 6
    out = speculation_conclusions(runs_, table, "aligned", "misaligned", k_rows, {"aligned": ["json"]}, "cpu")
    texts = [c.text for c in out]
    assert len(out) == 4 + 2 + 1 + 1 + 1
    assert out[0].verdict == NOT_SHOWN and "eval regressed in json" in texts[0]  # aligned, slower at concurrency 1
    assert out[1].verdict == SHOWN and "misaligned, concurrency 1" in texts[1]  # slower, as expected
    assert "0.41x at concurrency 1 -> 0.59x at 8" in texts[4] and "shrinks" not in texts[4]  # the busy-machine bug
    assert texts[-1].startswith("CPU vs GPU:")


def test_a_speculative_step_cheaper_than_a_plain_one_reads_as_a_busy_machine_not_a_speed_up():
    # the busy-machine run: the misaligned draft (nothing accepted) "1.68x faster", its step 0.3x a plain step
    row = speedups(runs([11.6], [19.5], base_tpot=190.6, spec_tpot=65.2, acceptance=0.0, length=1.0),
                   k={ALIGNED: 3}).iloc[0].to_dict()
    assert not row["consistent"] and row["draft_cost_x"] == 0.0
    c = method_conclusion(row, expect="worse")
    assert c.verdict == WITHIN_NOISE and "Not a measurement of speculation" in c.text and "faster" not in c.text
    trend = trend_conclusion("misaligned", {**_row(1, 0.81, step=1.2), "consistent": True},
                             {**_row(4, 1.68, step=0.34), "consistent": False})
    assert trend.verdict == WITHIN_NOISE and "no trend" in trend.text
    honest = speedups(runs([100], [80], spec_tpot=12.5, acceptance=0.0, length=1.0)).iloc[0].to_dict()
    assert honest["consistent"] and method_conclusion(honest, expect="worse").verdict == SHOWN


def two_concurrencies(low_spec, high_spec, low_tpot=10.0, high_tpot=10.0):
    """Section 3's table: no speculation and the aligned draft at concurrencies 1 and 8, two repeats each."""
    table = pd.concat([runs([100, 102], low_spec, 1, spec_tpot=low_tpot),
                       runs([400, 404], high_spec, 8, spec_tpot=high_tpot)], ignore_index=True)
    return speedups(table, k={ALIGNED: 3})


@pytest.mark.parametrize("spec, outcome", [([150, 148], "faster"), ([40, 42], "slower"), ([99, 103], "about the same")])
def test_the_one_stream_prediction_follows_the_measured_verdict(spec, outcome):
    from helpers.lessons.l06 import SPEED_CHOICES, one_stream_outcome

    found, detail = one_stream_outcome(two_concurrencies(spec, [400, 404]), ALIGNED)
    assert found == outcome and found in SPEED_CHOICES and "concurrency 1:" in detail
    assert one_stream_outcome(two_concurrencies(spec, [400, 404]), "another draft")[0] == "about the same"


def test_the_one_stream_prediction_reads_a_busy_machine_as_no_speed_up():
    from helpers.lessons.l06 import one_stream_outcome

    busy = two_concurrencies([150, 148], [400, 404], low_tpot=2.0)  # a speculative step at 0.56x a plain one
    outcome, detail = one_stream_outcome(busy, ALIGNED)
    assert outcome == "about the same" and "Not a measurement of speculation" in detail


def test_the_core_summary_reads_section_3_alone_both_ways():
    from helpers.lessons.l06 import core_conclusions

    faster = core_conclusions(two_concurrencies([150, 148], [404, 400], low_tpot=6.7), ALIGNED, profile="gpu")
    assert [c.verdict for c in faster[:2]] == [SHOWN, ""]  # faster at concurrency 1, no expectation at 8
    assert "shrinks" in faster[2].text and faster[2].verdict == SHOWN and faster[-1].text.startswith("GPU:")
    slower = core_conclusions(two_concurrencies([40, 42], [200, 204], low_tpot=25.0), ALIGNED, {ALIGNED: ["json"]})
    assert slower[0].verdict == NOT_SHOWN and "slower" in slower[0].text and "eval regressed in json" in slower[0].text
    assert slower[-1].text.startswith("CPU vs GPU:") and len(slower) == 4
    assert not any("misaligned" in c.text for c in slower)  # Go deeper's methods are not read on the core path
    assert core_conclusions(two_concurrencies([150, 148], [404, 400]), "another draft")[0].verdict == WITHIN_NOISE


# ---------------------------------------------------------------- prompt lookup by hand, the method map

from helpers.lessons.l06 import copied_text_lookup, lookup_outcome, method_map, prompt_lookup_length  # noqa: E402


def test_prompt_lookup_copies_what_it_has_seen():
    text = [1, 2, 3, 4, 5, 9]
    assert prompt_lookup_length(text + [1, 2, 3, 4, 5], 6, 3) == pytest.approx(5 / 3)
    assert prompt_lookup_length(text + [7, 8, 10, 11], 6, 3) == 1.0  # nothing seen before: one token per step
    long_copy, _ = copied_text_lookup("tiny-agent", "What's it like outside in Douala today, and tomorrow?", 8, 3)
    short_copy, _ = copied_text_lookup("tiny-agent", "What's it like outside in Douala today, and tomorrow?", 1, 3)
    assert 1 < short_copy < long_copy <= 4
    assert [lookup_outcome(x, 3) for x in (1.0, 2.5, 3.9)] == ["about 1", "between 1 and k+1", "about k+1"]


def test_the_method_map_says_what_runs_here():
    table = method_map("tiny-agent", measured=["ngram", "draft_model"]).set_index("--speculative-config method")
    assert set(table.index) >= {"ngram", "suffix", "draft_model", "eagle / eagle3", "mtp", "medusa"}
    assert table.loc["ngram", "this machine"] == "yes" and table.loc["draft_model", "this notebook"] == "measured"
    assert table.loc["medusa", "this machine"].startswith("no: needs") and table.loc["mtp", "this notebook"] == "-"
    assert method_map("tiny-agent", [], profile="k8s")["this machine"].str.startswith("not probed").all()


# ---------------------------------------------------------------- the draft-then-verify picture

from matplotlib.figure import Figure  # noqa: E402

from helpers.lessons.l06 import draft_then_verify, steps_summary, verify_steps  # noqa: E402


def test_chunk_sizes_read_as_kept_and_rejected_guesses():
    steps = verify_steps([1, 4, 1, 2, 7, 3], k=3)  # prefill; all 3 kept; none; 1 kept; merged; 2 kept
    assert steps.kind.tolist() == ["prefill", "step", "step", "step", "merged", "step"]
    verified = steps[steps.kind == "step"]
    assert verified.kept.tolist() == [3, 0, 1, 2] and verified.rejected.tolist() == [0, 1, 1, 1]
    assert verified.unchecked.tolist() == [0, 2, 1, 0]  # after the rejected guess nothing is checked
    assert (verified.kept + verified.rejected + verified.unchecked == 3).all()
    summary = steps_summary(steps, 3)
    assert summary.startswith("4 verification steps: 6 of 12 guesses kept (50%), 2.50 tokens per step (k = 3)")
    assert "1 chunk(s) held several steps" in summary
    with pytest.raises(ValueError, match="carried 0 tokens"):
        verify_steps([1, 0], k=3)


def test_the_picture_draws_one_row_per_step_and_each_slot():
    steps = verify_steps([1, 4, 1, 2, 9], k=3)
    fig = draft_then_verify(steps, 3, max_steps=4, title="synthetic")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["prefill", "step 1", "step 2", "step 3"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["guess 1", "guess 2", "guess 3", "target"]
    assert len(ax.patches) == 4 * 4  # k guess slots and the target's token, for each of the 4 rows
    colours = [p.get_facecolor()[:3] for p in ax.patches]
    from matplotlib.colors import to_rgb
    assert colours.count(to_rgb("#d04a3a")) == 2  # step 2 and 3 each rejected one guess
    assert colours.count(to_rgb("#3a923a")) == 3 + 1  # step 1 kept 3, step 3 kept 1
    assert steps_summary(verify_steps([5], 3), 3).startswith("no verification step")
