"""A replica dies under load: what a client sees, and whether the service survives by the rule.

- ``replica_failure_run``: runs a multi-turn agent workload (``helpers.measure.routing.AgentWorkload``)
  through the router, SIGKILLs one replica mid-run, counts what completed, failed and was lost, reads the
  router's retry and circuit-breaker figures, times the replica's restart and its return to the rotation.
- ``FailureRun``: that run's requests by phase (``table``), what happened in a few lines (``story``) and
  ``SURVIVAL_RULE`` applied to it (``survival``, through ``conclude_failure``).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion
from helpers.engine.router import SESSION_HEADER, describe_failover, figure_deltas
from helpers.measure.loadgen import run_sync
from helpers.measure.routing import (AFFINITY, AgentWorkload, account, arun_agent_workload, replica_snapshots,
                                     requests_frame)
from helpers.measure.server_metrics import MetricsError, scrape

if TYPE_CHECKING:
    from helpers.engine.replicas import ReplicaSet

FAILURE_CONVERSATIONS = 32  # 4 turns, 4 at a time: on a 2-core AMX laptop, a run that outlasts the 6 s detection window
SURVIVAL_RULE = ("A run survives a replica's death when (1) no request is lost: every request sent ends in a "
                 "complete answer or an error the client sees; (2) requests sent after the router has had time "
                 "to notice (the detection window) all complete; (3) the killed replica, restarted, serves "
                 "requests through the router again.")
SURVIVES = "the service survives one replica's death"  # what the failure run expects


@dataclass
class FailureRun:
    """What happened to every request when replica ``killed_replica`` was killed at ``t_kill_s``."""

    requests: pd.DataFrame
    killed_replica: int
    killed_pid: int | None
    t_kill_s: float | None  # seconds after the first request
    detect_s: float  # the detection window the rule allows
    restart_s: float | None  # the replica's restart, until it served again
    rejoin_s: float | None  # after the restart, until the router sent it a request
    router: dict[str, float] = field(default_factory=dict)  # router figures that changed during the run
    policy: str = ""

    @property
    def counts(self) -> dict[str, int]:
        return account(self.requests)

    def after_detection(self) -> pd.DataFrame:
        """Requests sent after the kill plus the detection window."""
        if self.t_kill_s is None or self.requests.empty:
            return self.requests.iloc[0:0]
        return self.requests[self.requests["t_start"] > self.t_kill_s + self.detect_s]

    def table(self) -> pd.DataFrame:
        """Outcomes by phase: before the kill, during the detection window, after it."""
        frame = self.requests.copy()
        if frame.empty:
            return frame
        kill = float("inf") if self.t_kill_s is None else self.t_kill_s
        frame["phase"] = ["before the kill" if t < kill else ("detection window" if t <= kill + self.detect_s else "after")
                          for t in frame["t_start"]]
        frame["outcome"] = ["completed" if ok else ("failed" if err else "lost") for ok, err in zip(frame["ok"], frame["error"])]
        return frame.pivot_table(index="phase", columns="outcome", values="turn", aggfunc="count", fill_value=0)

    def survival(self) -> Conclusion:
        """``SURVIVAL_RULE`` applied to this run; within noise when no replica was killed."""
        if self.t_kill_s is None:
            return Conclusion(self.not_killed(), WITHIN_NOISE, SURVIVES)
        late = self.after_detection()
        return conclude_failure(self.counts, int((~late["ok"].astype(bool)).sum()),
                                None if self.restart_s is None else self.rejoin_s is not None, len(late))

    def story(self, worker_urls: list[str]) -> str:
        """When the replica was killed, how long its restart and its return to the rotation took, what the router
        counted (per replica, ``worker_urls`` as the router knows them)."""
        if self.t_kill_s is None:
            return self.not_killed()
        lines = [f"Killed replica {self.killed_replica} (SIGKILL) {self.t_kill_s:.1f} s into the run, router policy "
                 f"{self.policy}; detection window {self.detect_s:g} s."]
        if self.restart_s is not None:
            rejoin = (f"the router sent it a request again {self.rejoin_s:.1f} s later" if self.rejoin_s is not None
                      else "the router did not send it a request again within the wait")
            lines.append(f"Restarted in {self.restart_s:.1f} s (until it served again); {rejoin}.")
        lines.append(describe_failover(self.router, worker_urls))
        return "\n".join(lines)

    def not_killed(self) -> str:
        """The sentence for a run that ended before the kill threshold."""
        answers = int(self.requests["ok"].sum()) if len(self.requests) else 0
        return (f"No replica was killed: the run ended after {answers} answers, before the kill threshold (lower "
                "KILL_AFTER_ANSWERS or give the run more conversations).")


def busiest_replica(before: list[Any], now: list[Any]) -> int:
    """The replica with the most requests running now, then the most finished since ``before`` (snapshots)."""
    def load(i: int) -> tuple[float, float]:
        if now[i] is None:
            return (-1.0, -1.0)
        done = (now[i].counter("request_success") or 0.0) - ((before[i].counter("request_success") or 0.0) if before[i] else 0.0)
        return (now[i].gauge("num_requests_running") or 0.0, done)

    return max(range(len(now)), key=load)


def replica_failure_run(engine: "ReplicaSet", replica: int | None = None, workload: AgentWorkload | None = None,
                        kill_after_completed: int = 4, detect_s: float = 6.0, restart: bool = True,
                        rejoin_timeout_s: float = 60.0, policy: str | None = AFFINITY,
                        seed: int | None = None, progress: bool | None = None) -> FailureRun:
    """Run ``workload`` through the router (restarted on ``policy``; None keeps it); after ``kill_after_completed``
    answers, SIGKILL replica ``replica`` (None: the busiest then, so the kill hits sessions in flight); then
    (``restart``) start it again and wait until the router sends it a request."""
    workload = workload or AgentWorkload(conversations=FAILURE_CONVERSATIONS, turns=4, concurrency=4)
    salt = secrets.randbits(24) if seed is None else seed
    if policy is not None:
        engine.set_policy(policy)
    router_before = engine.router.read_figures()
    counters_before = replica_snapshots(engine.metrics_urls())
    state: dict[str, Any] = {"done": 0, "t_kill": None, "pid": None, "replica": replica}

    def on_row(row: dict[str, Any]) -> None:
        state["done"] += 1 if row["ok"] else 0
        if state["t_kill"] is None and state["done"] >= kill_after_completed:
            if state["replica"] is None:
                state["replica"] = busiest_replica(counters_before, replica_snapshots(engine.metrics_urls()))
            state["pid"] = engine.kill_replica(state["replica"])
            state["t_kill"] = time.perf_counter()

    from helpers.core.progress import bar

    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with bar(3 if restart else 1, "replica failure", "step", progress) as shown:
        shown.set_postfix_str(f"load; a replica is killed after {kill_after_completed} answers")
        run_sync(lambda: arun_agent_workload(engine.settings.base_url, engine.model, workload, salt,
                                             engine.settings.auth_headers(), rows, on_row))
        shown.update(1)
        replica = state["replica"] if state["replica"] is not None else 0
        frame = requests_frame(rows, t0)
        router = figure_deltas(router_before, engine.router.read_figures())
        restart_s = rejoin_s = None
        if restart and state["pid"] is not None:
            shown.set_postfix_str(f"restarting replica {replica}")
            restart_s = engine.restart_replica(replica)
            shown.update(1)
            shown.set_postfix_str("waiting until the router sends it a request")
            rejoin_s = _wait_rejoin(engine, replica, rejoin_timeout_s, salt)
            shown.update(1)
    t_kill = None if state["t_kill"] is None else state["t_kill"] - t0
    return FailureRun(frame, replica, state["pid"], t_kill, detect_s, restart_s, rejoin_s, router, engine.router.load().policy or "")


def _wait_rejoin(engine: "ReplicaSet", replica: int, timeout_s: float, salt: int) -> float | None:
    """Seconds until a request through the router is served by ``replica`` (its request counter grows)."""
    import httpx

    url = engine.metrics_urls()[replica]
    t0 = time.monotonic()
    start = scrape(url).counter("request_success") or 0.0
    n = 0
    while time.monotonic() - t0 < timeout_s:
        n += 1
        try:
            httpx.post(engine.settings.base_url + "/chat/completions", timeout=30, headers={
                **engine.settings.auth_headers(), SESSION_HEADER: f"rejoin-{salt}-{n}"},
                json={"model": engine.model, "messages": [{"role": "user", "content": f"ping {n}"}], "max_tokens": 1})
        except httpx.HTTPError:
            pass
        try:
            if (scrape(url).counter("request_success") or 0.0) > start:
                return time.monotonic() - t0
        except MetricsError:
            pass
        time.sleep(0.2)
    return None


def conclude_failure(counts: dict[str, int], failed_after_detection: int, rejoined: bool | None,
                     sent_after_detection: int | None = None) -> Conclusion:
    """``SURVIVAL_RULE`` on a failure run's numbers: shown (survived) or not shown, with the reason; says so when
    no request was sent after the detection window (``sent_after_detection`` 0), so rule (2) went untested."""
    expectation = SURVIVES
    problems = []
    if counts["lost"]:
        problems.append(f"{counts['lost']} request(s) lost without an answer or an error")
    if failed_after_detection:
        problems.append(f"{failed_after_detection} request(s) sent after the detection window failed")
    if rejoined is False:
        problems.append("the restarted replica did not get requests again")
    text = (f"{counts['sent']} sent, {counts['completed']} completed, {counts['failed']} failed (the client saw an "
            f"error), {counts['lost']} lost")
    if problems:
        return Conclusion(text + "; not survived: " + "; ".join(problems), NOT_SHOWN, expectation)
    if sent_after_detection == 0:
        text += ("; no request was sent after the detection window, so rule (2) was not tested (the run ended "
                 "too soon: give it more conversations)")
    return Conclusion(text + "; survived by the rule", SHOWN, expectation)
