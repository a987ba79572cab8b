"""``workshop routing``: the routing-policy comparison and the replica-failure run from a terminal.

Uses the replica set recorded on ``WORKSHOP_PORT`` (``workshop up --replicas N``), or starts one for the run
and stops it after. Prints the per-policy and per-replica tables, TTFT per turn, the verdicts, the CPU caveat
and the GPU estimate; ``--failure`` adds the failure run.
"""

from __future__ import annotations

import argparse
import os
import sys

from helpers.cli.args import number_type


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``workshop routing``."""
    p = subparsers.add_parser("routing", help="compare the router's policies on a multi-turn agent workload "
                              "(per-replica prefix-cache hits, TTFT per turn); --failure kills a replica mid-run",
                              description=__doc__)
    p.add_argument("--replicas", type=number_type(int, 2, 8), default=2, help="when no replica set runs yet")
    p.add_argument("--policies", default="round_robin,consistent_hash,cache_aware", help="comma-separated")
    p.add_argument("--repeats", type=number_type(int, 1), default=1, help="rounds, the policy order rotated each round")
    p.add_argument("--conversations", type=number_type(int, 1), default=12)
    p.add_argument("--turns", type=number_type(int, 1), default=4)
    p.add_argument("--system-words", type=number_type(int, 1), default=200, help="~3 tokens each (tiny models)")
    p.add_argument("--concurrency", type=number_type(int, 1), default=4, help="conversations at a time")
    p.add_argument("--max-tokens", type=number_type(int, 1), default=16)
    p.add_argument("--failure", action="store_true", help="also kill the busiest replica mid-run and restart it")
    p.add_argument("--split-cost", action="store_true", help="also compare with one engine alone on the same cores "
                   "(started on the port after the router's metrics, stopped after), interleaved, --repeats rounds")
    p.set_defaults(func=run_routing)


def run_routing(args: argparse.Namespace) -> int:
    """Compare the policies (and, with --failure, kill a replica); print what was measured."""
    import pandas as pd

    from helpers.measure import failover, routing as so
    from helpers.core.conclusion import report
    from helpers.engine.replicas import ReplicaSet, replica_set_for, usable_cores
    from helpers.engine.router import POLICIES
    from helpers.core.settings import load_settings

    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        print(f"error: unknown policies {unknown}: choose from {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    settings = load_settings()
    engine = replica_set_for(settings)
    started = engine is None
    if started:
        engine = ReplicaSet(settings, args.replicas, policies[0])
        print(f"starting {args.replicas} replicas and the router on port {settings.port} ...", flush=True)
        engine.start()
    workload = so.AgentWorkload(conversations=args.conversations, turns=args.turns, system_words=args.system_words,
                                concurrency=args.concurrency, max_tokens=args.max_tokens)
    pd.set_option("display.width", 200)
    try:
        comp = so.compare_policies(engine, policies, workload, repeats=args.repeats, progress=True)
        summary = comp.summary()
        print(summary.to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
        print(comp.per_replica().to_string(index=False, float_format=lambda v: f"{v:,.3f}"))
        print("TTFT per turn (ms):")
        print(comp.ttft_per_turn().to_string())
        print(report(so.conclude_affinity(comp.samples("hit_rate")), so.conclude_later_turns(comp.samples("ttft_later_s")),
                     so.cpu_caveat(engine.n, len(usable_cores())), so.gpu_expectation(engine.n)))
        if args.failure:
            failing = so.AgentWorkload(conversations=failover.FAILURE_CONVERSATIONS, turns=4,
                                       system_words=args.system_words, concurrency=args.concurrency,
                                       max_tokens=args.max_tokens)
            run = failover.replica_failure_run(engine, progress=True, workload=failing)
            print(run.table().to_string())
            print(run.story(engine.worker_urls()))
            print(report(run.survival(), failover.SURVIVAL_RULE))
        if args.split_cost:
            _split_cost(engine, settings, workload, args.repeats)
    finally:
        if started and not os.environ.get("WORKSHOP_KEEP_REPLICAS"):
            engine.stop()
    return 0


def _split_cost(engine, settings, workload, repeats: int) -> None:
    """One engine alone (vLLM's own CPU binding, the replicas' KV budget) beside the replica set, interleaved."""
    from dataclasses import replace

    from helpers.measure import routing as so
    from helpers.engine.interface import default_config
    from helpers.engine.local import LocalEngine
    from helpers.engine.replicas import replica_settings, router_metrics_port
    from helpers.core.vllm_args import with_flag

    single = LocalEngine(replica_settings(settings, router_metrics_port(settings.port, engine.n) + 1))
    config = default_config(settings)
    if engine.kv_bytes:
        config = replace(config, args=with_flag(config.args, "--kv-cache-memory-bytes", engine.kv_bytes))
    print(f"starting one engine alone on port {single.settings.port} ...", flush=True)
    single.start(config)
    try:
        runs = so.split_cost_runs(engine, single.settings.base_url, workload, repeats=max(2, repeats), progress=True)
        print(runs.to_string(index=False, float_format=lambda v: f"{v:,.2f}"))
        print(so.conclude_split_cost(runs))
    finally:
        single.stop()
