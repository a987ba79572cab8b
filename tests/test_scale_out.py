"""Scale-out lessons: the agent workload's content, request accounting, per-replica hit rates, the verdicts
(with numbers going both ways) and the tables of a policy comparison and a failure run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE
from helpers.measure.failover import FailureRun, busiest_replica, conclude_failure
from helpers.measure.routing import (AgentWorkload, PolicyComparison, account, conclude_affinity, conclude_later_turns,
                                     cpu_caveat, gpu_expectation, replica_rows, requests_frame, session_id,
                                     system_prompt, total_hit_rate, user_turn)
from helpers.measure.server_metrics import parse_metrics

METRICS = (Path(__file__).parent / "fixtures" / "vllm_metrics.txt").read_text()


def test_content_is_unique_per_conversation_and_run_and_stable():
    a, b = system_prompt(1, 0, 50), system_prompt(1, 1, 50)
    assert a != b and a.split()[:3] != b.split()[:3]  # they differ from the first words on
    assert system_prompt(2, 0, 50) != a  # a new run (salt) never reuses a cache another run warmed
    assert system_prompt(1, 0, 50) == a and len(a.split()) > 50
    assert user_turn(1, 0, 2, 10) != user_turn(1, 0, 3, 10)
    assert session_id(7, 3) == "s7-3"


def test_workload_validation():
    with pytest.raises(ValueError, match="turns"):
        AgentWorkload(turns=0).validate()
    assert AgentWorkload(conversations=3, turns=4).requests == 12


def _row(ok, error="", turn=1, t=0.0):
    return {"ok": ok, "error": error, "turn": turn, "t_start": t, "t_end": t + 1, "ttft_s": 0.1 if ok else None,
            "conversation": 0, "completion_tokens": 4 if ok else None}


def test_account_counts_lost_requests():
    frame = requests_frame([_row(True, t=10), _row(False, "HTTP 502: bad", t=11), _row(False, "", t=12)])
    assert account(frame) == {"sent": 3, "completed": 1, "failed": 1, "lost": 1}
    assert frame["t_start"].tolist() == [0, 1, 2]
    assert account(pd.DataFrame()) == {"sent": 0, "completed": 0, "failed": 0, "lost": 0}


def test_replica_rows_and_total_hit_rate_from_counters():
    before = parse_metrics(METRICS)
    after = parse_metrics(METRICS.replace("vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"tiny-agent\"} 38400.0",
                                          "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"tiny-agent\"} 38700.0")
                          .replace("vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"tiny-agent\"} 153600.0",
                                   "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"tiny-agent\"} 154000.0"))
    rows = replica_rows([before, before, None], [after, before, before])
    assert rows[0]["prefix_hits"] == 300 and rows[0]["prefix_queries"] == 400 and rows[0]["hit_rate"] == pytest.approx(0.75)
    assert rows[1]["prefix_queries"] == 0 and rows[2]["hit_rate"] is None  # idle, unreadable
    assert total_hit_rate(rows) == pytest.approx(0.75)
    assert total_hit_rate([{"prefix_queries": 0, "prefix_hits": 0}]) is None


@pytest.mark.parametrize("rr, ch, verdict", [
    ([0.50, 0.52], [0.70, 0.71], SHOWN),
    ([0.70, 0.71], [0.50, 0.52], NOT_SHOWN),
    ([0.60, 0.70], [0.62, 0.66], WITHIN_NOISE),
])
def test_affinity_verdict_both_ways(rr, ch, verdict):
    c = conclude_affinity({"round_robin": rr, "consistent_hash": ch})
    assert c.verdict == verdict and "round_robin" in c.text
    assert conclude_affinity({"round_robin": rr}).verdict == WITHIN_NOISE


@pytest.mark.parametrize("rr, ch, verdict", [([1.4, 1.5], [0.7, 0.8], SHOWN), ([0.7, 0.8], [1.4, 1.5], NOT_SHOWN)])
def test_later_turn_verdict_both_ways(rr, ch, verdict):
    assert conclude_later_turns({"round_robin": rr, "consistent_hash": ch}).verdict == verdict


@pytest.mark.parametrize("counts, after, rejoined, verdict, words", [
    ({"sent": 20, "completed": 18, "failed": 2, "lost": 0}, 0, True, SHOWN, "survived"),
    ({"sent": 20, "completed": 18, "failed": 1, "lost": 1}, 0, True, NOT_SHOWN, "lost"),
    ({"sent": 20, "completed": 17, "failed": 3, "lost": 0}, 1, True, NOT_SHOWN, "detection window"),
    ({"sent": 20, "completed": 20, "failed": 0, "lost": 0}, 0, False, NOT_SHOWN, "did not get requests"),
])
def test_failure_rule_both_ways(counts, after, rejoined, verdict, words):
    c = conclude_failure(counts, after, rejoined)
    assert c.verdict == verdict and words in c.text


def test_a_run_that_ends_inside_the_detection_window_says_rule_2_went_untested():
    counts = {"sent": 20, "completed": 19, "failed": 1, "lost": 0}
    assert "rule (2) was not tested" in conclude_failure(counts, 0, True, sent_after_detection=0).text
    assert "rule (2)" not in conclude_failure(counts, 0, True, sent_after_detection=5).text


def test_failure_run_phases():
    rows = [_row(True, t=0.0), _row(False, "ServerDisconnectedError", t=2.0), _row(True, t=3.0), _row(True, t=20.0)]
    run = FailureRun(requests_frame(rows, 0.0), 1, 123, t_kill_s=1.5, detect_s=6.0, restart_s=30.0, rejoin_s=1.0)
    table = run.table()
    assert table.loc["before the kill", "completed"] == 1 and table.loc["detection window", "failed"] == 1
    assert table.loc["after", "completed"] == 1
    assert len(run.after_detection()) == 1 and run.counts["failed"] == 1


def _comparison():
    runs = pd.DataFrame([
        {"repeat": 0, "policy": "round_robin", "duration_s": 10, "hit_rate": 0.5, "throughput_tok_s": 20.0, "ttft_later_s": 1.4, "failed": 0},
        {"repeat": 0, "policy": "consistent_hash", "duration_s": 8, "hit_rate": 0.7, "throughput_tok_s": 25.0, "ttft_later_s": 0.8, "failed": 0}])
    reps = pd.DataFrame([
        {"repeat": 0, "policy": "round_robin", "replica": 0, "prefix_queries": 100, "prefix_hits": 50, "requests": 6},
        {"repeat": 0, "policy": "round_robin", "replica": 1, "prefix_queries": 100, "prefix_hits": 50, "requests": 6},
        {"repeat": 0, "policy": "consistent_hash", "replica": 0, "prefix_queries": 150, "prefix_hits": 105, "requests": 9},
        {"repeat": 0, "policy": "consistent_hash", "replica": 1, "prefix_queries": 50, "prefix_hits": 35, "requests": 3}])
    reqs = pd.DataFrame([{**_row(True, turn=t), "policy": p, "ttft_s": s} for p, t, s in
                         [("round_robin", 1, 0.2), ("round_robin", 2, 1.4), ("consistent_hash", 1, 0.2), ("consistent_hash", 2, 0.8)]])
    return PolicyComparison(reps, reqs, runs, AgentWorkload(), 2)


def test_comparison_tables():
    comp = _comparison()
    summary = comp.summary().set_index("policy")
    assert summary.loc["consistent_hash", "hit_rate"] == 0.7
    assert summary.loc["consistent_hash", "busiest_replica_share"] == pytest.approx(0.75)
    assert summary.loc["round_robin", "ttft_later_ms"] == pytest.approx(1400)
    per_replica = comp.per_replica().set_index(["policy", "replica"])
    assert per_replica.loc[("consistent_hash", 0), "hit_rate"] == pytest.approx(0.7)
    assert comp.ttft_per_turn().loc["consistent_hash", 2] == pytest.approx(800)
    assert comp.samples("hit_rate") == {"round_robin": [0.5], "consistent_hash": [0.7]}


def test_caveat_and_estimate_are_labelled():
    assert "share" in cpu_caveat(2, 2) and "cannot grow" in cpu_caveat(2, 2)
    assert gpu_expectation(2).startswith("Estimate, not measured")


def test_the_busiest_replica_is_the_one_with_most_running_then_most_finished():
    idle = parse_metrics(METRICS)
    running = METRICS.replace('vllm:num_requests_running{engine="0",model_name="tiny-agent"} 8.0',
                              'vllm:num_requests_running{engine="0",model_name="tiny-agent"} 9.0')
    assert 'num_requests_running{engine="0",model_name="tiny-agent"} 9.0' in running
    assert busiest_replica([idle, idle], [idle, parse_metrics(running)]) == 1
    more_done = METRICS.replace("vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"tiny-agent\"} 12.0",
                                "vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"tiny-agent\"} 22.0")
    assert more_done != METRICS and busiest_replica([idle, idle], [parse_metrics(more_done), idle]) == 0
    assert busiest_replica([idle, idle], [None, idle]) == 1


def test_split_cost_conclusion_names_both_sides_and_the_ratio():
    from helpers.measure.routing import conclude_split_cost

    runs = pd.DataFrame([{"setup": "one engine", "throughput_tok_s": v} for v in (20.0, 22.0)]
                        + [{"setup": "2 replicas + router", "throughput_tok_s": v} for v in (15.0, 16.0)])
    text = conclude_split_cost(runs).text
    assert "2 replicas + router: 15.5" in text and "21.0 for one engine" in text and "0.74x" in text


def test_a_skipped_scale_out_run_says_why_everywhere():
    from helpers.lessons.l07_saturation import ScaleOutRun, failure_timeline, routing_by_policy

    run = ScaleOutRun(skipped="The engine runs in a cluster: ...")
    assert run.affinity().verdict == WITHIN_NOISE and "cluster" in run.affinity().text
    assert run.survival().verdict == WITHIN_NOISE and run.failure_story() == run.skipped
    assert run.summary().empty and run.failure_table().empty and run.caveats() == []
    assert "not run here" in str(run.conclusions()[0])
    assert routing_by_policy(run) is None and failure_timeline(run) is None


def test_a_scale_out_run_concludes_from_its_numbers():
    import matplotlib.pyplot as plt

    from helpers.lessons.l07_saturation import ScaleOutRun, failure_timeline, routing_by_policy

    rows = [{**r, "e2e_s": 1.0} for r in (_row(True, t=0.0), _row(False, "ServerDisconnectedError", t=2.0),
                                          _row(True, t=3.0), _row(True, t=20.0))]
    failure = FailureRun(requests_frame(rows, 0.0), 1, 123, t_kill_s=1.5, detect_s=6.0, restart_s=30.0, rejoin_s=None,
                         router={"vllm_router_retries_total{route=/v1/chat/completions}": 2.0}, policy="consistent_hash")
    run = ScaleOutRun(_comparison(), failure, n_replicas=2, cores=2)
    assert "70.0%" in run.affinity().text and "50.0%" in run.affinity().text
    story = run.failure_story()
    assert "Killed replica 1" in story and "1.5 s" in story and "did not send it a request again" in story
    assert "The router retried 2 time(s); 0 request(s) ran out of retries." in story
    survival = run.survival()  # restarted but never back in the rotation: not survived, whatever else went well
    assert failure.story(run.worker_urls) == story and str(failure.survival()) == str(survival)  # what the CLI prints
    assert survival.verdict == NOT_SHOWN and "did not get requests" in survival.text
    assert [str(c) for c in run.conclusions()][-1] == str(survival) and len(run.conclusions()) == 7
    assert str(run.conclusions()[0]).startswith("- round_robin over 2 replicas: prefix-cache hit rate 50.0%, TTFT turn 1 200 ms, later turns 1,400 ms")
    for figure in (routing_by_policy(run), failure_timeline(run)):
        assert len(figure.axes) >= 1
        plt.close(figure)
    never_killed = ScaleOutRun(_comparison(), FailureRun(failure.requests, 1, None, None, 6.0, None, None), 2, cores=2)
    assert never_killed.failure_story().startswith("No replica was killed: the run ended after 3 answers")
    assert never_killed.survival().verdict == WITHIN_NOISE  # nothing was killed: nothing survived or failed
    no_restart = ScaleOutRun(_comparison(), FailureRun(failure.requests, 1, 123, 1.5, 6.0, None, None), 2, cores=2)
    assert no_restart.survival().verdict == SHOWN  # without a restart, the rejoin is not judged


def test_the_router_failover_is_told_per_replica():
    from helpers.engine.router import describe_failover

    urls = ["http://127.0.0.1:8881", "http://127.0.0.1:8882"]
    deltas = {"vllm_router_retries_total{route=/v1/chat/completions}": 9.0,
              "vllm_router_retries_exhausted_total{route=/v1/chat/completions}": 1.0,
              f"vllm_router_cb_outcomes_total{{outcome=failure,worker={urls[1]}}}": 10.0,
              f"vllm_router_cb_outcomes_total{{outcome=success,worker={urls[0]}}}": 8.0,
              f"vllm_router_cb_state_transitions_total{{from=closed,to=open,worker={urls[1]}}}": 1.0,
              "vllm_router_worker_health{worker=http://127.0.0.1:8882}": 1.0}
    text = describe_failover(deltas, urls)
    assert text == ("The router retried 9 time(s); 1 request(s) ran out of retries; replica 1: 10 failed attempt(s), "
                    "circuit breaker opened 1 time(s).")
    assert describe_failover({}, urls) == "The router exposed no figures for this run."
