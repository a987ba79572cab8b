"""Against two real replicas of the tiny agent behind a real vllm-router (``workshop up --replicas 2``).

One replica set is started for the module on WORKSHOP_TEST_PORT (router) and the three ports after it
(two replicas, the router's metrics), in its own state directory; the last test stops it with
``workshop down`` and checks that nothing is left. Assertions are on counters and on what every request
became, never on timings.
"""

from __future__ import annotations

import contextlib
import io
import os

import psutil
import pytest

from fakes import engine_environment
from helpers.cli import main as cli
from helpers.engine.process import STATE_MARK, port_holder
from helpers.engine.replicas import ReplicaSet, replica_set_for
from helpers.measure.failover import replica_failure_run
from helpers.measure.routing import AgentWorkload, compare_policies, conclude_affinity
from helpers.core.conclusion import SHOWN
from helpers.core.settings import load_settings

pytestmark = pytest.mark.engine
PORT = int(os.environ.get("WORKSHOP_TEST_PORT", "8765"))
# Small enough for CI, and sized so the direction is far beyond noise: with one conversation at a time,
# round robin sends turn 2 of every conversation to the other replica (a miss of the whole system prompt),
# consistent_hash sends it to the replica that holds it.
WORKLOAD = AgentWorkload(conversations=4, turns=3, system_words=200, turn_words=10, max_tokens=4, concurrency=1)


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(list(argv))
    return code, out.getvalue()


def _ours(state_dir: str) -> list[psutil.Process]:
    """Live processes started for this module's state directory (router and engines carry its path)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if state_dir in proc.environ().get(STATE_MARK, ""):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def replica_set(tmp_path_factory):
    # Engines of their own, not the suite's shared one: two replicas behind the router, and the tests kill one.
    with engine_environment(PORT, tmp_path_factory.mktemp("replicas-state")):
        try:
            code, out = _cli("up", "--replicas", "2", "--router", "round_robin")
            assert code == 0, out
            engine = replica_set_for(load_settings())
            assert isinstance(engine, ReplicaSet)
            yield engine
        finally:
            with contextlib.suppress(Exception):
                ReplicaSet(load_settings(), 2).stop()


def test_router_and_two_replicas_serve_and_status_lists_them(replica_set):
    code, out = _cli("status")
    assert code == 0
    assert f"http://127.0.0.1:{PORT} (pid" in out and "policy round_robin" in out
    assert out.count(" ready threads ") == 2  # both replicas, each with its share of compute threads
    rows = replica_set.replica_rows()
    assert [r["port"] for r in rows] == [PORT + 1, PORT + 2] and all(r["ready"] for r in rows)
    assert {r["threads"] for r in rows} == {str(max(1, len(os.sched_getaffinity(0)) // 2))}  # an equal share each
    assert replica_set.status()["ready"] is True  # /v1/models through the router


def test_session_affinity_gives_more_prefix_cache_hits_than_round_robin(replica_set):
    comp = compare_policies(replica_set, ("round_robin", "consistent_hash"), WORKLOAD, repeats=1)
    assert comp.requests["ok"].all(), comp.requests[~comp.requests["ok"]]["error"].tolist()
    hits = comp.samples("hit_rate")
    assert hits["consistent_hash"][0] > hits["round_robin"][0] + 0.15, hits
    assert conclude_affinity(hits).verdict == SHOWN
    per_replica = comp.per_replica()
    # round robin reaches both replicas; consistent_hash may put all four sessions on one (1 run in 8)
    robin = per_replica[per_replica["policy"] == "round_robin"]
    assert set(robin["replica"]) == {0, 1} and robin["prefix_queries"].gt(0).all(), per_replica


def test_a_killed_replica_loses_no_request_silently(replica_set):
    # No restart here (it would double this test's time): `workshop routing --failure` measures the restart and
    # the return to the router's rotation.
    workload = AgentWorkload(conversations=4, turns=3, system_words=100, turn_words=10, max_tokens=4, concurrency=2)
    run = replica_failure_run(replica_set, workload=workload, kill_after_completed=2, restart=False)  # the busiest
    counts = run.counts
    assert run.killed_pid is not None and run.t_kill_s is not None
    assert counts["lost"] == 0 and counts["sent"] == counts["completed"] + counts["failed"], counts
    assert counts["completed"] > 2  # the run went on after the kill, on the other replica
    assert set(run.table().columns) <= {"completed", "failed"}  # every phase: answered or a visible error
    assert not replica_set.replica_rows()[run.killed_replica]["ready"]


def test_metrics_read_every_replica_not_only_the_one_the_router_forwards_to(replica_set):
    ready = [row["ready"] for row in replica_set.replica_rows()]  # the replica killed above stays down
    code, out = _cli("metrics")
    assert code == 0 and out.count("--- replica ") == 2, out
    assert out.count("cannot read its /metrics") == ready.count(False)
    assert out.count("prefix_cache_queries") == ready.count(True)
    router = out.split("--- router (port ")[1]  # the router's own figures, after the replicas
    assert "vllm_router_requests_total" in router and "vllm_router_worker_health" in router, out


def test_down_leaves_no_process_and_frees_every_port(replica_set):
    state_dir = os.environ["WORKSHOP_STATE_DIR"]
    assert _ours(state_dir), "the replica set should be running before down"
    ready = [row["ready"] for row in replica_set.replica_rows()]  # the replica killed above stays down
    code, out = _cli("down")
    assert code == 0 and "router (pid" in out and any(ready)
    for i, up in enumerate(ready):
        assert (f"replica {i} (pid" if up else f"replica {i} (was not running)") in out, out
    assert _ours(state_dir) == []
    assert not any(port_holder(p)[0] for p in (PORT, PORT + 1, PORT + 2, PORT + 3))
    assert replica_set_for(load_settings()) is None  # a later `workshop up` starts a single engine
