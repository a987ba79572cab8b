"""benchmarks/tracing_cost.py's order and arithmetic (the benchmark itself prints figures; it is not run here)."""

from pathlib import Path

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load():
    return load_script(ROOT / "benchmarks" / "tracing_cost.py")


def test_runs_interleave_off_then_on_each_round():
    tc = _load()
    assert tc.order(2) == [(0, "off"), (0, "on"), (1, "off"), (1, "on")]


def test_summary_is_on_over_off_per_round_with_its_spread():
    tc = _load()
    rows = [{"round": 0, "arm": "off", "mean_tpot_ms": 10.0}, {"round": 0, "arm": "on", "mean_tpot_ms": 11.0},
            {"round": 1, "arm": "off", "mean_tpot_ms": 10.0}, {"round": 1, "arm": "on", "mean_tpot_ms": 13.0}]
    line = next(x for x in tc.summarize(rows, tc._compare_module()) if x["figure"] == "mean_tpot_ms")
    assert line["rounds"] == 2
    assert abs(line["ratio"] - 1.2) < 1e-9 and abs(line["spread"] - 0.1) < 1e-9
    assert line["verdict"] == "tracing on +20.0%"
    lone = [r for r in rows if r["round"] == 0 or r["arm"] == "off"]  # round 1 has no "on": it does not count
    line = next(x for x in tc.summarize(lone, tc._compare_module()) if x["figure"] == "mean_tpot_ms")
    assert line["rounds"] == 1 and line["spread"] is None
