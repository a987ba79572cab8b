"""``workshop bench`` / ``workshop metrics`` handlers, against the in-process fake of vLLM."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from fake_vllm import MODEL, FakeVllm

from helpers.cli import bench as bench_cli

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_metrics.txt"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="workshop")
    bench_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def fake(monkeypatch):
    server = FakeVllm(metrics_text=FIXTURE.read_text()).start()
    monkeypatch.setenv("VLLM_HOST", server.base_url)
    monkeypatch.setenv("MODEL_NAME", MODEL)
    yield server
    server.stop()


def test_bench_sweep_prints_a_table_and_saves_vllm_named_json_and_csv(fake, tmp_path, capsys):
    code = run(["bench", "--concurrency", "1,2", "--input-len", "60", "--output-len", "4", "--num-requests", "4",
                "--warmup", "1", "--slo", "ttft_ms=500", "--json", str(tmp_path / "r.jsonl"),
                "--csv", str(tmp_path / "r.csv")])
    out = capsys.readouterr().out
    assert code == 0
    assert "TTFT p50 ms" in out and "out tok/s" in out
    runs = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["max_concurrency"] for r in runs] == [1, 2]
    assert all(r["completed"] == 4 and r["failed"] == 0 and r["total_output_tokens"] == 16 for r in runs)
    assert runs[0]["request_goodput"] is not None and "p99_ttft_ms" in runs[0]
    assert runs[0]["server_kv_cache_usage_max"] == 0.4375  # sampled from /metrics during the run
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 3
    assert len(fake.chat_payloads) == 2 * (4 + 1)


def test_bench_can_send_the_requests_vllm_bench_serve_sends(fake, capsys):
    code = run(["bench", "--concurrency", "1", "--input-len", "60", "--output-len", "4", "--num-requests", "2",
                "--warmup", "0", "--no-metrics", "--vllm-bench-requests"])
    assert code == 0, capsys.readouterr()
    assert all("min_tokens" not in p and p["ignore_eos"] is True and p["stream_options"] == {"include_usage": True}
               for p in fake.chat_payloads)


def test_bench_against_an_unreachable_endpoint_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("VLLM_HOST", "http://127.0.0.1:1/v1")
    assert run(["bench", "--concurrency", "1", "--input-len", "60", "--output-len", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Cannot reach the engine") and err.count("\n") == 1


@pytest.mark.parametrize("flags, message", [
    (["--concurrency", "1,x"], "--concurrency needs a whole number"),
    (["--concurrency", "8,1"], "increasing"),
    (["--rate", "0"], "--rate must be > 0 (got '0')"),
    (["--rate", "nan"], "--rate needs a finite number (got 'nan')"),
    (["--concurrency", "2", "--num-requests", "-5"], "--num-requests must be >= 1 (got '-5')"),
    (["--concurrency", "2", "--warmup", "-1"], "--warmup must be >= 0 (got '-1')"),
    (["--concurrency", "2", "--duration", "inf"], "--duration needs a finite number"),
    (["--concurrency", "2", "--json", str(FIXTURE.parent)], f"--json {FIXTURE.parent} is a directory"),
    (["--concurrency", "2", "--csv", str(FIXTURE / "runs.csv")], f"{FIXTURE} is a file, not a directory"),
    (["--concurrency", "2", "--max-concurrency", "4"], "--max-concurrency caps an open loop"),
    (["--concurrency", "2", "--slo", "latency_ms=3"], "unknown SLO"),
    (["--concurrency", "2", "--prefix", "shared"], "shared_prefix_len"),
])
def test_bench_bad_input_is_one_line_and_exit_2(flags, message, capsys, monkeypatch):
    monkeypatch.setenv("VLLM_HOST", "http://127.0.0.1:1/v1")
    assert run(["bench", *flags, "--input-len", "60", "--output-len", "4"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_metrics_from_a_file_and_from_the_endpoint(fake, capsys):
    assert run(["metrics", "--file", str(FIXTURE), "--json"]) == 0
    values = json.loads(capsys.readouterr().out)
    assert values["kv_cache_usage"] == 0.4375 and values["cache_config"]["block_size"] == 128
    assert run(["metrics"]) == 0  # the current endpoint (VLLM_HOST) + /metrics, as text
    out = capsys.readouterr().out
    assert "prefix_cache_hit_rate: 0.25" in out and "cache_config.num_gpu_blocks: 4096" in out


def test_metrics_errors_are_one_line_and_exit_2(capsys, tmp_path):
    assert run(["metrics", "--file", str(tmp_path / "missing.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "weights.bin").write_bytes(bytes([0x98, 0xff, 0x00]))
    assert run(["metrics", "--file", str(tmp_path / "weights.bin")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "as text (UnicodeDecodeError)" in err and err.count("\n") == 1
    assert run(["metrics", "--url", "http://127.0.0.1:1/metrics", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Cannot read") and err.count("\n") == 1


def test_metrics_of_a_replica_set_show_every_replica(fake, capsys, monkeypatch):
    # the router forwards /metrics to one replica: behind it, each replica is read on its own port
    urls = {"replica 0 (port 8001)": fake.base_url.removesuffix("/v1") + "/metrics",
            "replica 1 (port 8002)": fake.base_url.removesuffix("/v1") + "/metrics"}
    monkeypatch.setattr(bench_cli, "_replica_metrics_urls", lambda: urls)
    assert run(["metrics"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- replica ") == 2 and "--- replica 1 (port 8002)" in out
    assert out.count("prefix_cache_hit_rate: 0.25") == 2
    assert run(["metrics", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == set(urls)


def test_metrics_of_a_replica_set_name_a_replica_that_cannot_be_read(fake, capsys, monkeypatch):
    urls = {"replica 0 (port 8001)": fake.base_url.removesuffix("/v1") + "/metrics",
            "replica 1 (port 1)": "http://127.0.0.1:1/metrics"}
    monkeypatch.setattr(bench_cli, "_replica_metrics_urls", lambda: urls)
    assert run(["metrics"]) == 0  # the live replica is shown; the dead one is named with the reason
    out = capsys.readouterr().out
    assert "--- replica 1 (port 1): cannot read its /metrics: " in out and "prefix_cache_hit_rate: 0.25" in out
    monkeypatch.setattr(bench_cli, "_replica_metrics_urls", lambda: {"replica 1 (port 1)": urls["replica 1 (port 1)"],
                                                                      "router (port 2)": "http://127.0.0.1:2/metrics"})
    assert run(["metrics"]) == 2  # no replica could be read
    assert "--- router (port 2): cannot read its /metrics: ConnectError" in capsys.readouterr().out


def test_bench_samples_metrics_every_two_seconds_unless_told(fake, monkeypatch, capsys):
    seen = []
    real = bench_cli.run_sweep
    monkeypatch.setattr(bench_cli, "run_sweep", lambda *a, **kw: seen.append(kw["sample_interval_s"]) or real(*a, **kw))
    base = ["bench", "--concurrency", "1", "--input-len", "60", "--output-len", "4", "--num-requests", "2",
            "--warmup", "0"]
    assert run(base) == 0 and run([*base, "--metrics-every", "0.25"]) == 0
    assert seen == [bench_cli.METRICS_EVERY_S, 0.25] and bench_cli.METRICS_EVERY_S == 2.0
    with pytest.raises(SystemExit) as exit_info:
        run([*base, "--metrics-every", "0"])
    assert exit_info.value.code == 2 and "--metrics-every" in capsys.readouterr().err
