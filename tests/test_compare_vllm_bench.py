"""The arithmetic of benchmarks/compare_vllm_bench.py (ratio, spread, verdict), on made-up pairs, without an engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_module import load_script

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_vllm_bench.py"
bench = load_script(PATH)


def rows(vllm: list[float | None], ours: list[float | None], name: str = "output_throughput") -> list[dict]:
    return ([{"pair": i, "tool": "vllm", name: v} for i, v in enumerate(vllm)]
            + [{"pair": i, "tool": "workshop", name: v} for i, v in enumerate(ours)])


def line(vllm, ours, name="output_throughput"):
    return bench.compare(rows(vllm, ours, name), figures=(name,))[0]


def test_ratio_is_the_mean_of_the_per_pair_ratios_and_spread_half_their_range():
    out = line([500.0, 400.0, 500.0, 400.0], [450.0, 400.0, 400.0, 380.0])
    ratios = [0.9, 1.0, 0.8, 0.95]
    assert out["pairs"] == 4
    assert out["ratio"] == pytest.approx(sum(ratios) / 4)
    assert out["spread"] == pytest.approx((1.0 - 0.8) / 2)
    assert out["vllm_mean"] == pytest.approx(450) and out["workshop_mean"] == pytest.approx(407.5)


def test_within_noise_when_the_spread_covers_the_difference_and_not_when_it_does_not():
    noisy = line([500.0, 500.0, 500.0, 500.0], [400.0, 560.0, 480.0, 500.0])  # ratios 0.8..1.12: mean 0.97
    assert noisy["verdict"] == "within noise"
    assert noisy["within_tolerance"] is True  # |0.97 - 1| within 5%
    steady = line([500.0, 500.0, 500.0, 500.0], [430.0, 435.0, 440.0, 435.0])  # ratios 0.86..0.88
    assert steady["verdict"] == "ours -13.0%"
    assert steady["within_tolerance"] is False
    higher = line([10.0, 10.0], [12.0, 12.2], "mean_tpot_ms")  # ours reads TPOT 21% higher, spread 0.01
    assert higher["verdict"] == "ours +21.0%" and higher["within_tolerance"] is False


def test_edge_cases_one_pair_missing_values_and_figures_without_tolerance():
    one = line([500.0], [450.0])
    assert one["spread"] is None and one["verdict"] == "ours -10.0% (one pair: no spread)"
    gaps = line([500.0, None, 0.0, 400.0], [450.0, 300.0, 10.0, 400.0])  # pairs 1 and 2 cannot give a ratio
    assert gaps["pairs"] == 2 and gaps["ratio"] == pytest.approx(0.95)
    empty = line([None, None], [1.0, 2.0])
    assert empty["ratio"] is None and empty["verdict"] == "no data" and empty["within_tolerance"] is None
    assert line([5.0, 5.0], [5.0, 5.0], "mean_itl_ms")["within_tolerance"] is None  # the issue sets none for ITL


def test_pairs_are_matched_by_number_not_by_order():
    mixed = [{"pair": 1, "tool": "workshop", "mean_ttft_ms": 22.0}, {"pair": 0, "tool": "vllm", "mean_ttft_ms": 10.0},
             {"pair": 1, "tool": "vllm", "mean_ttft_ms": 20.0}, {"pair": 0, "tool": "workshop", "mean_ttft_ms": 11.0},
             {"pair": 2, "tool": "vllm", "mean_ttft_ms": 99.0}]  # pair 2 has no workshop run: left out
    out = bench.compare(mixed, figures=("mean_ttft_ms",))[0]
    assert out["pairs"] == 2 and out["ratio"] == pytest.approx(1.1) and out["spread"] == pytest.approx(0.0)


def test_the_table_prints_each_verdict_and_tolerance():
    text = bench.format_table(bench.compare(rows([500.0, 500.0], [430.0, 440.0])))
    assert "output_throughput" in text and "ours -13.0%" in text and "tolerance 5%: NOT met" in text


def _args(**switches):
    import argparse

    base = dict(input_len=256, output_len=64, requests=64, concurrency=4, warmups=4, same_seed=False,
                vllm_default_temperature=False, range_ratio=0.0, workshop_args="")
    return argparse.Namespace(**{**base, **switches})


def test_issue_32s_candidates_each_undo_one_matching_of_vllms_command():
    matched = bench.vllm_command(_args(), "http://h:1", "m", "tok", 3, Path("out"))
    assert matched[matched.index("--seed") + 1] == "3"  # a seed per pair: no run finds the last one's prompts
    assert matched[matched.index("--temperature") + 1] == "0"
    same = bench.vllm_command(_args(same_seed=True), "http://h:1", "m", "tok", 3, Path("out"))
    assert same[same.index("--seed") + 1] == "0"
    default = bench.vllm_command(_args(vllm_default_temperature=True), "http://h:1", "m", "tok", 3, Path("out"))
    assert "--temperature" not in default
    assert len(matched) - len(default) == 2  # only the flag and its value went


def test_a_range_ratio_gives_both_tools_the_same_length_range():
    args = _args(range_ratio=0.25)
    theirs = bench.vllm_command(args, "http://h:1", "m", "tok", 0, Path("out"))
    assert theirs[theirs.index("--random-range-ratio") + 1] == "0.25"
    ours = bench.workshop_command(args, 264, 0, Path("out"))  # 264: the server's count, template included
    assert ours[ours.index("--input-len") + 1] == "200:328"  # 264 -+ 25% of vLLM's 256
    assert ours[ours.index("--output-len") + 1] == "48:80"
    fixed = bench.workshop_command(_args(), 264, 0, Path("out"))
    assert fixed[fixed.index("--input-len") + 1] == "264" and "--random-range-ratio" not in bench.vllm_command(
        _args(), "http://h:1", "m", "tok", 0, Path("out"))
