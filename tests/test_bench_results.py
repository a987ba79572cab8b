"""Summaries of a small synthetic run, every figure computed by hand (numpy's linear percentiles)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from helpers.measure.bench_results import (client_lag_warning, load_json, requests_frame, save_csv, save_json, summarize,
                                   sweep_table)
from helpers.measure.loadgen import LoadResult, RequestRecord
from helpers.measure.workloads import Load, Workload
from helpers.measure.stream_timing import StreamTiming


def timing(t_scheduled, t_sent, chunks, t_done, prompt_tokens, error=None):
    t = StreamTiming(t_sent=t_sent, t_scheduled=t_scheduled)
    t.record_chunk(t_sent + 0.01, 0, "")  # vLLM's role-only first chunk
    running = 0
    for at, k in chunks:
        running += k
        t.record_chunk(at, running, "x" * k)
    t.prompt_tokens = prompt_tokens
    t.t_done = t_done
    t.error = error
    return t


def synthetic_run() -> LoadResult:
    """A: ttft 100 ms, chunks of 1, 2, 1 tokens; B: queued 50 ms, ttft 200; C: ttft 300; D: failed."""
    a = timing(0.0, 0.0, [(0.10, 1), (0.20, 2), (0.30, 1)], 0.31, 100)
    b = timing(0.0, 0.05, [(0.25, 1), (0.45, 1)], 0.50, 50)
    c = timing(0.1, 0.1, [(0.4, 1), (0.5, 1), (0.6, 1), (0.7, 1)], 0.80, 100)
    d = timing(0.2, 0.2, [(0.3, 1)], 0.35, 80, error="HTTP 500: boom")
    records = [RequestRecord(i, t, 100, 4) for i, t in enumerate([a, b, c, d])]
    return LoadResult(records, Load(concurrency=2, num_requests=4), Workload(input_len=100, output_len=4),
                      model="m", base_url="http://x/v1", t_start=0.0, t_end=1.0, started_at=1_800_000_000.0,
                      loop_lag_s=[0.001, 0.003, 0.002], max_inflight=2)


def test_throughputs_over_the_measured_window_count_completed_requests_only():
    s = summarize(synthetic_run())
    assert (s["completed"], s["failed"], s["duration"]) == (3, 1, 1.0)
    assert s["total_input_tokens"] == 250 and s["total_output_tokens"] == 10
    assert s["request_throughput"] == pytest.approx(3.0)
    assert s["output_throughput"] == pytest.approx(10.0)
    assert s["total_token_throughput"] == pytest.approx(260.0)
    assert s["error_counts"] == {"HTTP 500: boom": 1}


def test_latency_statistics_by_hand():
    s = summarize(synthetic_run())
    # TTFT 100, 200, 300 ms (the role-only chunk does not count)
    assert s["mean_ttft_ms"] == pytest.approx(200)
    assert s["median_ttft_ms"] == pytest.approx(200)
    assert s["p90_ttft_ms"] == pytest.approx(280)  # 200 + 0.8 * 100
    assert s["p99_ttft_ms"] == pytest.approx(298)
    assert s["std_ttft_ms"] == pytest.approx((20000 / 3) ** 0.5)
    # TPOT: A (300-100)/3, B 200/1, C 300/3
    assert s["mean_tpot_ms"] == pytest.approx((200 / 3 + 200 + 100) / 3)
    assert s["median_tpot_ms"] == pytest.approx(100)
    assert s["p95_tpot_ms"] == pytest.approx(100 + 0.9 * 100)
    # ITL per chunk, pooled: 100, 100 | 200 | 100, 100, 100
    assert s["mean_itl_ms"] == pytest.approx(700 / 6)
    assert s["median_itl_ms"] == pytest.approx(100)
    assert s["p99_itl_ms"] == pytest.approx(195)
    # ITL per token: A's two-token chunk gives two 50 ms samples
    assert s["mean_itl_per_token_ms"] == pytest.approx(100)
    assert s["p50_itl_per_token_ms"] == pytest.approx(100)
    assert s["mean_e2el_ms"] == pytest.approx((310 + 450 + 700) / 3)
    assert s["median_client_queue_time_ms"] == pytest.approx(0)
    assert s["mean_client_queue_time_ms"] == pytest.approx(50 / 3)
    assert s["median_e2el_including_client_queue_ms"] == pytest.approx(500)
    assert s["mean_ttfot_ms"] == pytest.approx(200)
    assert s["mean_tokens_per_chunk"] == pytest.approx(10 / 9) and s["max_tokens_per_chunk"] == 2
    assert s["median_tokens_per_s_per_user"] == pytest.approx(10)  # 1/TPOT: 15, 5, 10
    assert s["client_loop_lag_mean_ms"] == pytest.approx(2) and s["client_loop_lag_max_ms"] == pytest.approx(3)


def test_goodput_counts_requests_within_every_slo():
    s = summarize(synthetic_run(), slos={"ttft_ms": 250, "tpot_ms": 150})
    # A meets both; B's TPOT is 200 ms; C's TTFT is 300 ms
    assert s["good_requests"] == 1 and s["request_goodput"] == pytest.approx(1.0)
    assert summarize(synthetic_run(), slos={"e2el": 1000})["good_requests"] == 3  # vLLM's key style too
    assert summarize(synthetic_run())["request_goodput"] is None
    with pytest.raises(ValueError, match="unknown SLO"):
        summarize(synthetic_run(), slos={"latency_ms": 10})


def test_tpot_and_e2el_end_at_the_last_chunk_with_choices_as_vllm_bench_serve_does():
    """Issue 32: vLLM's latency is send -> last chunk with choices (a finish chunk after the last token's
    included), TPOT = (latency - ttft) / (tokens - 1); the end of the stream ([DONE]) is not the end."""
    run = synthetic_run()
    a, b, c = run.requests[:3]
    a.choice_times = [0.01, 0.10, 0.20, 0.30, 0.40]  # role chunk, tokens, a finish chunk 100 ms later, no text
    b.choice_times = [0.06, 0.25, 0.45]  # B's finish rides on its last token chunk
    c.choice_times = [0.11, 0.4, 0.5, 0.6, 0.7]
    s = summarize(run)
    # TPOT: A (400 - 100) / 3 = 100 (ours from its tokens would be 200/3), B 200 / 1, C 300 / 3
    assert s["mean_tpot_ms"] == pytest.approx((100 + 200 + 100) / 3)
    # e2el: A 400 (not its 310 ms end of stream), B 450 - 50 = 400, C 700 - 100 = 600
    assert s["mean_e2el_ms"] == pytest.approx((400 + 400 + 600) / 3)
    assert s["median_e2el_including_client_queue_ms"] == pytest.approx(450)  # B waited 50 ms in the client
    assert list(requests_frame(run)["tpot_ms"][:3]) == pytest.approx([100, 200, 100])
    # ITL: every gap between chunks with choices, the role chunk's and A's finish chunk's included
    gaps_ms = [90, 100, 100, 100] + [190, 200] + [290, 100, 100, 100]
    assert s["mean_itl_ms"] == pytest.approx(sum(gaps_ms) / len(gaps_ms))
    assert s["mean_itl_per_token_ms"] == pytest.approx(100)  # ours, over token chunks, unchanged
    # goodput judges the same TPOT: A now meets a 120 ms TPOT SLO, B does not
    assert summarize(run, slos={"tpot_ms": 120})["good_requests"] == 2


def test_a_run_where_everything_failed_has_no_latency_not_zero():
    run = synthetic_run()
    for r in run.requests:
        r.timing.error = "ConnectError: refused"
    s = summarize(run)
    assert s["completed"] == 0 and s["failed"] == 4
    assert s["median_ttft_ms"] is None and s["mean_itl_ms"] is None
    assert s["request_throughput"] == 0.0


VLLM_FIELDS = ["duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
               "request_goodput", "output_throughput", "total_token_throughput", "request_rate", "burstiness",
               "max_concurrency", "num_prompts", "model_id", "backend", "date"]
VLLM_METRICS = ["ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue"]


def test_json_field_names_follow_vllm_bench_serve(tmp_path):
    s = summarize(synthetic_run())
    for name in VLLM_FIELDS:
        assert name in s
    for metric in VLLM_METRICS:
        for stat in ("mean", "median", "std", "p99"):
            assert f"{stat}_{metric}_ms" in s
    assert s["request_rate"] == "inf" and s["max_concurrency"] == 2  # closed loop = rate inf + concurrency cap
    path = save_json([s, s], tmp_path / "runs.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["p99_ttft_ms"] == pytest.approx(298)
    assert load_json(path)[1]["completed"] == 3


def test_the_names_we_share_exist_in_the_installed_vllm_benchmark():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed here")
    source = (Path(list(spec.submodule_search_locations)[0]) / "benchmarks" / "serve.py").read_text()
    for name in VLLM_FIELDS + VLLM_METRICS:
        assert f'"{name}"' in source, name
    assert 'result[f"p{p_word}_{metric_attribute_name}_ms"]' in source  # the percentile naming we follow


def test_requests_frame_and_csv(tmp_path):
    run = synthetic_run()
    frame = requests_frame(run)
    assert len(frame) == 4 and frame["ok"].tolist() == [True, True, True, False]
    assert frame.loc[1, "client_queue_ms"] == pytest.approx(50)
    assert frame.loc[0, "max_tokens_per_chunk"] == 2
    summaries = [summarize(run), summarize(run, label="again")]
    back = pd.read_csv(save_csv(summaries, tmp_path / "runs.csv"))
    assert len(back) == 2 and back.loc[0, "mean_ttft_ms"] == pytest.approx(200)
    table = sweep_table(summaries)
    assert {"request_throughput", "median_ttft_ms", "p99_itl_ms"} <= set(table.columns)


def test_client_lag_warning_only_when_the_client_lags():
    assert client_lag_warning({"client_loop_lag_p99_ms": 2.0}) is None
    assert "client" in client_lag_warning({"client_loop_lag_p99_ms": 40.0})


def test_server_window_and_gauges_join_the_summary_with_vllms_spec_decode_units():
    run = synthetic_run()
    run.server = {"prefix_cache_hit_rate": 0.5, "spec_decode_num_drafts": 100.0, "spec_decode_num_draft_tokens": 300.0,
                  "spec_decode_num_accepted_tokens": 150.0, "spec_decode_acceptance_rate": 0.5,
                  "spec_decode_mean_acceptance_length": 2.5,
                  "spec_decode_per_position_acceptance_rate": [0.7, 0.5, 0.3]}
    run.gauges = pd.DataFrame({"kv_cache_usage": [0.1, 0.8], "num_requests_running": [2, 4],
                               "num_requests_waiting": [0, 3]})
    s = summarize(run)
    assert s["server_prefix_cache_hit_rate"] == 0.5
    assert s["spec_decode_acceptance_rate"] == pytest.approx(50.0)  # percent, as vLLM writes it
    assert s["spec_decode_acceptance_length"] == 2.5 and s["spec_decode_num_drafts"] == 100
    assert s["server_kv_cache_usage_max"] == 0.8 and s["server_num_requests_waiting_max"] == 3
