"""Scorecard rows from load summaries, eval runs and the server's cache config; several side by side."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from fake_vllm import MODEL, FakeVllm

from helpers.evals import suite as evals, scorecard
from helpers.evals.suite import EvalRun, EvalSettings
from helpers.evals.scorecard import Scorecard, kv_capacity_tokens, scorecard_row
from helpers.measure.server_metrics import parse_metrics
from helpers.core.settings import load_settings
from helpers.engine.session import connect
from helpers.evals.toolcall import wilson_interval

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_metrics.txt"


def summary(c: int, tok_s: float, ttft: float) -> dict:
    """The fields of a bench_results summary the scorecard reads (closed loop at concurrency c)."""
    return {"mode": "concurrency", "concurrency": c, "max_concurrency": c, "output_throughput": tok_s,
            "mean_ttft_ms": ttft, "p90_ttft_ms": 2 * ttft, "mean_tpot_ms": 5.0, "median_ttft_ms": ttft}


def eval_run(failed_tool_calls: int = 0) -> EvalRun:
    tasks = evals.load_suite("smoke").tasks
    ids = [t.id for t in tasks if t.category == "tool_call"][:failed_tool_calls]
    rows = [{"id": t.id, "category": t.category, "kind": t.kind, "passed": t.id not in ids, "error": None,
             "latency_s": 0.01, "output": "x"} for t in tasks]
    return EvalRun("smoke", 1, MODEL, "http://x/v1", EvalSettings(), pd.DataFrame(rows))


def test_kv_capacity_from_the_servers_cache_config():
    cache = parse_metrics(FIXTURE.read_text()).cache_config()
    assert kv_capacity_tokens(cache) == 524_288
    assert kv_capacity_tokens({"num_gpu_blocks": 10, "block_size": 16}) == 160
    assert kv_capacity_tokens({}) is None and kv_capacity_tokens(None) is None


def test_size_on_disk_counts_every_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 2_000_000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tokenizer.json").write_bytes(b"x" * 500_000)
    assert scorecard.size_on_disk_mb(tmp_path) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="not a directory"):
        scorecard.size_on_disk_mb(tmp_path / "missing")


def test_a_row_holds_speed_quality_and_memory(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"x" * 1_000_000)
    cache = parse_metrics(FIXTURE.read_text()).cache_config()
    row = scorecard_row("bf16", load=[summary(1, 100.0, 20.0), summary(8, 600.0, 40.0), summary(32, 900.0, 90.0)],
                        evals=eval_run(failed_tool_calls=1), cache=cache, model_dir=tmp_path,
                        concurrencies=[1, 8], extra={"dtype": "bfloat16"})
    assert row["config"] == "bf16" and row["size_on_disk_mb"] == pytest.approx(1.0)
    assert row["kv_capacity_tokens"] == 524_288 and row["block_size"] == 128 and row["num_gpu_blocks"] == 4096
    assert row["c1_output_tok_s"] == 100.0 and row["c8_mean_ttft_ms"] == 40.0 and row["c8_p90_ttft_ms"] == 80.0
    assert row["c8_mean_tpot_ms"] == 5.0 and "c32_output_tok_s" not in row
    assert row["tool_call_pass_rate"] == 0.75
    assert (row["tool_call_ci_low"], row["tool_call_ci_high"]) == pytest.approx(wilson_interval(3, 4))
    assert row["all_pass_rate"] == 0.9 and row["eval_suite"] == "smoke v1" and row["dtype"] == "bfloat16"


def test_a_row_leaves_out_what_was_not_measured_and_refuses_a_missing_concurrency():
    assert scorecard_row("x") == {"config": "x"}
    assert set(scorecard_row("x", load=[summary(4, 1.0, 1.0)])) == {"config", "c4_output_tok_s", "c4_mean_ttft_ms",
                                                                   "c4_p90_ttft_ms", "c4_mean_tpot_ms"}
    with pytest.raises(ValueError, match=r"no load summary at concurrency \[8\]; measured: \[1\]"):
        scorecard_row("x", load=[summary(1, 1.0, 1.0)], concurrencies=[8])


def test_scorecard_side_by_side_markdown_and_json_round_trip(tmp_path):
    card = Scorecard()
    card.add(scorecard_row("bf16", load=[summary(1, 100.0, 20.0)], evals=eval_run(0)))
    card.add(scorecard_row("fp8", load=[summary(1, 150.0, 15.0)], evals=eval_run(2), extra={"note": "quantized"}))
    card.add(scorecard_row("bf16", load=[summary(1, 110.0, 20.0)], evals=eval_run(0)))  # a re-measure replaces
    frame = card.frame()
    assert list(frame.index) == ["fp8", "bf16"]
    assert frame.loc["bf16", "c1_output_tok_s"] == 110.0 and frame.loc["fp8", "tool_call_pass_rate"] == 0.5
    assert pd.isna(frame.loc["bf16", "note"])
    text = card.markdown()
    assert text.splitlines()[0] == "| figure | fp8 | bf16 |"
    assert "| c1_output_tok_s | 150 | 110 |" in text and "| note | quantized | - |" in text
    loaded = Scorecard.from_json(card.to_json(tmp_path / "card.json"))
    pd.testing.assert_frame_equal(loaded.frame(), frame)
    with pytest.raises(ValueError, match="needs a 'config'"):
        card.add({"x": 1})
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match="not a scorecard"):
        Scorecard.from_json(tmp_path / "other.json")


def test_measure_config_runs_evals_a_sweep_and_reads_the_cache(monkeypatch):
    server = FakeVllm(metrics_text=FIXTURE.read_text()).start()
    try:
        settings = load_settings({"VLLM_HOST": server.base_url, "MODEL_NAME": MODEL})
        asked = {}

        def fake_run_suite(lab, suite):
            asked.update(suite=suite, model=lab.model)
            return eval_run(0)

        monkeypatch.setattr(evals, "run_suite", fake_run_suite)
        row = scorecard.measure_config(connect(settings, start=False), "base", concurrencies=[1, 2], input_len=60, output_len=4,
                                       num_requests=3, suite="smoke")
    finally:
        server.stop()
    assert asked == {"suite": "smoke", "model": MODEL}
    assert row["config"] == "base" and row["model"] == MODEL and row["kv_capacity_tokens"] == 524_288
    assert row["c1_output_tok_s"] > 0 and row["c2_mean_ttft_ms"] > 0 and row["c2_mean_tpot_ms"] > 0
    assert row["all_pass_rate"] == 1.0
    assert len(server.chat_payloads) == 2 * (3 + 2)  # each run: 2 warm-up + 3 measured requests
