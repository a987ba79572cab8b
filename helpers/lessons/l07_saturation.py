"""What notebook 07 (saturation) needs beyond the floors below: its scale-out sections (6 and 7) as one run.

``lesson_replica_set`` decides where the replicas come from (the workshop's own replica set, a new set beside
a local CPU engine, or none, with the sentence that says why); ``run_scale_out`` compares the router's
policies on them (``helpers.measure.routing``) and kills one replica under load
(``helpers.measure.failover``); ``ScaleOutRun`` holds both and gives the notebook its tables, its
conclusions and the sentence that says why a section did not run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from helpers.core.conclusion import WITHIN_NOISE, Conclusion
from helpers.engine.interface import Engine, EngineError
from helpers.engine.replicas import ReplicaSet, replica_set_beside, usable_cores
from helpers.engine.router import RouterError, router_binary
from helpers.measure.failover import SURVIVES, FailureRun, replica_failure_run
from helpers.measure.routing import (AgentWorkload, PolicyComparison, compare_policies, conclude_affinity,
                                     conclude_later_turns, cpu_caveat, gpu_expectation)


def lesson_replica_set(engine: Engine, replicas: int = 2) -> tuple[ReplicaSet | None, bool, str]:
    """Where a notebook's scale-out lesson gets its replicas: ``(replica_set, start_it, why_not)``.

    The workshop's engine itself when it is a replica set (``workshop up --replicas N``: used as it is);
    a new set beside a local CPU engine (the notebook starts and stops it); otherwise None and one sentence
    saying why the lesson cannot start replicas from here and where it would run."""
    if isinstance(engine, ReplicaSet):
        return engine, False, ""
    settings = engine.settings
    if settings.profile == "k8s":
        return None, False, ("The engine runs in a cluster: there, replicas and the router are the instructor's "
                             "kustomize component k8s/components/router (an engine Deployment with N replicas, the "
                             "router finding them by label). This section starts replicas on the local CPU profile.")
    if not settings.managed:
        return None, False, (f"The endpoint {settings.base_url} is external (VLLM_HOST is set): replicas start only "
                             "where the workshop starts its own engine. Without VLLM_HOST, `workshop up --replicas "
                             f"{replicas}` runs them on this machine.")
    if settings.profile != "cpu":
        return None, False, (f"On the {settings.profile} profile the workshop's engine already holds the GPU's memory, "
                             f"so replicas beside it would not fit: `workshop down`, then `workshop up --replicas "
                             f"{replicas}` (one GPU per replica) and run this notebook again.")
    try:
        router_binary()
    except RouterError as err:
        return None, False, f"{err} This section is skipped until it is installed."
    return replica_set_beside(settings, replicas), True, ""


@dataclass
class ScaleOutRun:
    """The routing comparison and the failure run of notebook 07, or the sentence that says why they did not run."""

    comparison: PolicyComparison | None = None
    failure: FailureRun | None = None
    skipped: str = ""
    n_replicas: int = 0
    cores: int = 0
    worker_urls: list[str] = field(default_factory=list)  # the replicas, as the router knows them

    def summary(self) -> pd.DataFrame:
        """Per policy: hit rate (mean, min, max over repeats), TTFT turn 1 and later turns (ms), throughput."""
        return self.comparison.summary() if self.comparison is not None else pd.DataFrame()

    def affinity(self) -> Conclusion:
        """Session affinity against round robin on the replicas' prefix-cache hit rate."""
        if self.comparison is None:
            return Conclusion(self.skipped, WITHIN_NOISE, "session affinity keeps more of each conversation in cache")
        return conclude_affinity(self.comparison.samples("hit_rate"))

    def later_turns(self) -> Conclusion:
        """TTFT of turns 2+ with session affinity against round robin."""
        if self.comparison is None:
            return Conclusion(self.skipped, WITHIN_NOISE, "later turns start sooner with session affinity")
        return conclude_later_turns(self.comparison.samples("ttft_later_s"))

    def caveats(self) -> list[str]:
        """Why throughput cannot grow with replicas on this CPU, and the GPU expectation (an estimate)."""
        if self.comparison is None:
            return []
        return [cpu_caveat(self.n_replicas, self.cores), gpu_expectation(self.n_replicas)]

    def survival(self) -> Conclusion:
        """``SURVIVAL_RULE`` applied to the failure run."""
        if self.failure is None:
            return Conclusion(self.skipped or "no failure run", WITHIN_NOISE, SURVIVES)
        return self.failure.survival()

    def failure_story(self) -> str:
        """When the replica was killed, how long its restart and its return to the rotation took, what the router counted."""
        if self.failure is None:
            return self.skipped or "No failure run."
        return self.failure.story(self.worker_urls)

    def failure_table(self) -> pd.DataFrame:
        """The failure run's requests by phase (before the kill, detection window, after) and outcome."""
        return self.failure.table() if self.failure is not None else pd.DataFrame()

    def conclusions(self) -> list[Conclusion | str]:
        """Everything the two sections concluded, for the notebook's summary."""
        if self.comparison is None:
            return [Conclusion(f"Replicas behind a router: not run here. {self.skipped}")]
        return [*self.policy_lines(), self.affinity(), self.later_turns(), *map(Conclusion, self.caveats()),
                self.survival()]

    def policy_lines(self) -> list[Conclusion]:
        """One plain line per policy: hit rate (range over repeats), TTFT of turn 1 and later turns, throughput."""
        lines = []
        for row in self.summary().itertuples():
            spread = f" (runs {row.hit_rate_min:.1%}-{row.hit_rate_max:.1%})" if row.repeats > 1 else ""
            lines.append(Conclusion(f"{row.policy} over {self.n_replicas} replicas: prefix-cache hit rate "
                                    f"{row.hit_rate:.1%}{spread}, TTFT turn 1 {row.ttft_turn1_ms:,.0f} ms, later turns "
                                    f"{row.ttft_later_ms:,.0f} ms, {row.throughput_tok_s:,.1f} output tok/s, "
                                    f"{row.failed} failed"))
        return lines


def run_scale_out(lab: Any, replicas: int, policies: tuple[str, ...] | list[str], workload: AgentWorkload,
                  repeats: int = 1, failure_workload: AgentWorkload | None = None, kill_after_completed: int = 4,
                  restart: bool = True, progress: bool | None = None) -> ScaleOutRun:
    """Notebook 07's scale-out run: replicas behind the router (the workshop's own replica set, or ``replicas``
    started beside its engine and stopped after), the policies compared on ``workload``, then one replica
    killed under ``failure_workload`` (None: no failure run). Where replicas cannot run, nothing starts and
    ``skipped`` says why; a set that fails to start is stopped and reported the same way."""
    engine, start_it, why = lesson_replica_set(lab.engine, replicas)
    if engine is None:
        return ScaleOutRun(skipped=why)
    result = ScaleOutRun(n_replicas=engine.n, cores=len(usable_cores()), worker_urls=engine.worker_urls())
    try:
        if start_it:
            if progress is not False:
                print(f"starting {engine.n} replicas (ports {', '.join(map(str, engine.ports))}) and the router "
                      f"(port {engine.settings.port}) beside the workshop's engine ...", flush=True)
            engine.start()
        result.comparison = compare_policies(engine, tuple(policies), workload, repeats=repeats, progress=progress)
        if failure_workload is not None:
            result.failure = replica_failure_run(engine, workload=failure_workload, restart=restart, progress=progress,
                                                 kill_after_completed=kill_after_completed)
    except (EngineError, RouterError) as err:
        result.skipped = f"The replica set failed: {getattr(err, 'message', str(err))}"
    finally:
        if start_it:
            engine.stop()
    return result
