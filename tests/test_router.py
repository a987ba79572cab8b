"""The router's command line, its own metrics (captured from vllm-router 0.1.17), and a clear error without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.engine import router
from helpers.engine.router import RouterError, figure_deltas, router_command, router_figures

CAPTURED = (Path(__file__).parent / "fixtures" / "vllm_router_metrics_0.1.17.txt").read_text()


def test_command_names_workers_policy_and_ports():
    cmd = router_command("vllm-router", ["http://127.0.0.1:8851", "http://127.0.0.1:8852"], "consistent_hash", 8850, 8853)
    assert cmd[:4] == ["vllm-router", "--worker-urls", "http://127.0.0.1:8851", "http://127.0.0.1:8852"]
    assert cmd[cmd.index("--policy") + 1] == "consistent_hash"
    assert cmd[cmd.index("--port") + 1] == "8850" and cmd[cmd.index("--prometheus-port") + 1] == "8853"
    assert "--health-check-interval-secs" in cmd  # a dead replica is noticed within seconds


@pytest.mark.parametrize("policy, workers", [("least_busy", ["http://w:1"]), ("round_robin", [])])
def test_command_refuses_unknown_policy_and_no_workers(policy, workers):
    with pytest.raises(RouterError, match="policy|worker URL"):
        router_command("vllm-router", workers, policy, 1, 2)


def test_missing_binary_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(router.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RouterError, match=r"pip install vllm-router==0\.1\.17"):
        router.router_binary()


def test_captured_figures_show_retries_breaker_and_health():
    figures = router_figures(CAPTURED)
    assert figures["vllm_router_retries_total{route=/v1/chat/completions}"] == 6
    assert figures["vllm_router_worker_health{worker=http://127.0.0.1:8852}"] == 0  # the killed replica
    assert figures["vllm_router_cb_outcomes_total{outcome=failure,worker=http://127.0.0.1:8852}"] == 6
    assert not any(k.endswith("_bucket") or "_sum" in k for k in figures)
    assert router_figures("not prometheus {{{") == {}


def test_deltas_keep_counter_growth_and_nonzero_gauges():
    before = {"x_total{a=1}": 5.0, "health{w=1}": 1.0}
    after = {"x_total{a=1}": 8.0, "health{w=1}": 0.0, "y_total": 0.0, "active": 2.0}
    assert figure_deltas(before, after) == {"x_total{a=1}": 3.0, "health{w=1}": 0.0, "active": 2.0}  # health fell
    assert figure_deltas(before, after, contains=("x_",)) == {"x_total{a=1}": 3.0}
