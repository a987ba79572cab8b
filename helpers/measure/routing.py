"""Routing policies compared on a replica set: which one keeps an agent's cache warm.

- ``AgentWorkload``: multi-turn agent conversations: a system prompt unique to each conversation (and to each
  run: a fresh salt, so one policy never finds the cache another policy warmed), then turns that grow the
  conversation; ``concurrency`` conversations at a time; every request carries the ``X-Session-ID`` header
  that ``consistent_hash`` routes on.
- ``run_agent_workload``: sends it through an endpoint and returns one row per request sent: completed, or
  failed with what the client saw. A request sent is never dropped from the table.
- ``compare_policies``: per policy (interleaved across repeats, the router restarted per policy, the replicas
  kept), each replica's prefix-cache hit rate from its own counters (d hits / d queries), TTFT per turn and
  throughput. ``conclude_affinity`` / ``conclude_later_turns`` judge them against the run-to-run spread.
- ``per_replica_report``: each replica's share of a run (``workshop bench`` through a replica set);
  ``split_cost_runs``: one engine alone against the replicas on the same cores.

What a client sees when a replica dies under load is ``helpers.measure.failover``.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import pandas as pd

from helpers.core.comparison import compare_samples
from helpers.core.thinking import thinking_body
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, lesson_verdict
from helpers.measure.loadgen import run_sync
from helpers.engine.router import SESSION_HEADER, figure_deltas
from helpers.measure.server_metrics import MetricsError, scrape, window

if TYPE_CHECKING:
    from helpers.engine.replicas import ReplicaSet

WORDS = ("plan tool call read file write test check result error retry search answer user agent step note "
         "list open close send fetch parse value table row column index cache block token model query reply "
         "task goal state update merge branch commit build run log trace span metric alert owner team").split()
BASELINE, AFFINITY = "round_robin", "consistent_hash"
POLICY_ORDER = ("round_robin", "consistent_hash", "cache_aware")


@dataclass(frozen=True)
class AgentWorkload:
    """Multi-turn agent conversations; lengths in words (the tiny models' 512-token vocabulary splits one of
    these words into about 3 tokens: 200 words make a ~600-token system prompt, 5 KV blocks of 128)."""

    conversations: int = 12
    turns: int = 4
    system_words: int = 200
    turn_words: int = 30
    max_tokens: int = 16
    concurrency: int = 4
    request_timeout_s: float = 120.0

    def validate(self) -> None:
        """ValueError saying what to change when a size is out of range."""
        for name in ("conversations", "turns", "system_words", "turn_words", "max_tokens", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentWorkload.{name} must be >= 1 (got {getattr(self, name)})")

    @property
    def requests(self) -> int:
        return self.conversations * self.turns


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def system_prompt(salt: int, conversation: int, words: int) -> str:
    """A system prompt unique to (salt, conversation): the id first, so no KV block is shared with another."""
    rng = random.Random(f"{salt}-{conversation}-system")
    return f"session {salt} {conversation}. You are agent {conversation}. " + _words(rng, words)


def user_turn(salt: int, conversation: int, turn: int, words: int) -> str:
    """The user's message of one turn (what a tool returned, say)."""
    rng = random.Random(f"{salt}-{conversation}-{turn}")
    return f"turn {turn}: " + _words(rng, words)


def session_id(salt: int, conversation: int) -> str:
    """The X-Session-ID value of a conversation."""
    return f"s{salt}-{conversation}"


# ---------------------------------------------------------------- sending

async def _one_request(http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str],
                       row: dict[str, Any]) -> str:
    """Stream one chat completion into ``row`` (ok, ttft_s, e2e_s, tokens or the error); returns the text."""
    t0 = time.perf_counter()
    row["t_start"] = t0
    text, first = [], None
    try:
        async with http.post(url, json=body, headers=headers) as resp:
            row["status"] = resp.status
            if resp.status != 200:
                row["error"] = f"HTTP {resp.status}: {(await resp.text())[:160]}"
                return ""
            done = False
            async for raw in resp.content:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    row["error"] = f"error in stream: {str(chunk['error'])[:160]}"
                    return ""
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        first = first or time.perf_counter()
                        text.append(piece)
                usage = chunk.get("usage")
                if usage:
                    row["prompt_tokens"] = usage.get("prompt_tokens")
                    row["completion_tokens"] = usage.get("completion_tokens")
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                    row["cached_tokens"] = cached
            if not done:
                row["error"] = "the stream ended before [DONE] (connection closed)"
                return ""
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as err:
        row["error"] = f"{type(err).__name__}: {str(err)[:160]}"
        return ""
    finally:
        row["t_end"] = time.perf_counter()
        row["e2e_s"] = row["t_end"] - t0
    row["ok"] = True
    row["ttft_s"] = (first or row["t_end"]) - t0
    return "".join(text)


async def arun_agent_workload(base_url: str, model: str, workload: AgentWorkload, salt: int,
                              headers: dict[str, str] | None = None, rows: list[dict[str, Any]] | None = None,
                              on_row: Any = None) -> list[dict[str, Any]]:
    """Every conversation, ``concurrency`` at a time; a failed turn ends its conversation (the agent gives up)."""
    workload.validate()
    rows = [] if rows is None else rows
    url = base_url.rstrip("/") + "/chat/completions"
    sem = asyncio.Semaphore(workload.concurrency)
    timeout = aiohttp.ClientTimeout(total=workload.request_timeout_s)

    async def conversation(http: aiohttp.ClientSession, c: int) -> None:
        async with sem:
            messages = [{"role": "system", "content": system_prompt(salt, c, workload.system_words)}]
            for turn in range(1, workload.turns + 1):
                messages.append({"role": "user", "content": user_turn(salt, c, turn, workload.turn_words)})
                row: dict[str, Any] = {"conversation": c, "turn": turn, "session": session_id(salt, c), "ok": False,
                                       "status": None, "error": "", "ttft_s": None, "e2e_s": None,
                                       "prompt_tokens": None, "completion_tokens": None, "cached_tokens": None}
                rows.append(row)  # recorded when sent: a request is never missing from the table
                # thinking off: a Qwen3 model would otherwise spend a short turn's tokens reasoning
                body = {"model": model, "messages": messages, "max_tokens": workload.max_tokens, "temperature": 0.0,
                        "stream": True, "stream_options": {"include_usage": True}, **thinking_body(False)}
                reply = await _one_request(http, url, body, {**(headers or {}), SESSION_HEADER: row["session"]}, row)
                if on_row is not None:
                    on_row(row)
                if not row["ok"]:
                    return
                messages.append({"role": "assistant", "content": reply})

    async with aiohttp.ClientSession(timeout=timeout) as http:
        await asyncio.gather(*(conversation(http, c) for c in range(workload.conversations)))
    return rows


def requests_frame(rows: list[dict[str, Any]], t0: float | None = None) -> pd.DataFrame:
    """The request rows as a DataFrame, times in seconds from ``t0`` (the first send when None)."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    start = frame["t_start"].min() if t0 is None else t0
    for col in ("t_start", "t_end"):
        frame[col] = frame[col] - start
    return frame


def account(frame: pd.DataFrame) -> dict[str, int]:
    """sent / completed / failed / lost: lost are rows neither completed nor carrying an error."""
    if frame.empty:
        return {"sent": 0, "completed": 0, "failed": 0, "lost": 0}
    ok = frame["ok"].astype(bool)
    failed = ~ok & (frame["error"].astype(str) != "")
    return {"sent": len(frame), "completed": int(ok.sum()), "failed": int(failed.sum()),
            "lost": int((~ok & ~failed).sum())}


# ---------------------------------------------------------------- per-replica counters

def replica_snapshots(urls: list[str]) -> list[Any]:
    """One /metrics snapshot per replica (None for a replica that does not answer)."""
    out = []
    for url in urls:
        try:
            out.append(scrape(url, timeout_s=5.0))
        except MetricsError:
            out.append(None)
    return out


def replica_rows(before: list[Any], after: list[Any]) -> list[dict[str, Any]]:
    """Per replica: prefix-cache queries and hits (tokens), hit rate, requests finished, tokens generated."""
    rows = []
    for i, (b, a) in enumerate(zip(before, after)):
        w = window(b, a) if b is not None and a is not None else {}
        rows.append({"replica": i, "prefix_queries": w.get("prefix_cache_queries"), "prefix_hits": w.get("prefix_cache_hits"),
                     "hit_rate": w.get("prefix_cache_hit_rate"), "requests": w.get("request_success"),
                     "generation_tokens": w.get("generation_tokens")})
    return rows


def total_hit_rate(rows: list[dict[str, Any]]) -> float | None:
    """Hits over queries summed over replicas (a fraction), None when nothing was queried."""
    queries = sum(r["prefix_queries"] or 0 for r in rows)
    return None if not queries else sum(r["prefix_hits"] or 0 for r in rows) / queries


# ---------------------------------------------------------------- the policy comparison

@dataclass
class PolicyComparison:
    """Every run of ``compare_policies``: per-replica counters and per-request rows, with repeat and policy."""

    replicas: pd.DataFrame  # repeat, policy, replica, prefix_queries, prefix_hits, hit_rate, requests, ...
    requests: pd.DataFrame  # repeat, policy, conversation, turn, ok, ttft_s, ...
    runs: pd.DataFrame  # repeat, policy, duration_s, hit_rate (all replicas), throughput, failed
    workload: AgentWorkload
    n_replicas: int = 0

    def summary(self) -> pd.DataFrame:
        """Per policy: total hit rate (mean and range over repeats), TTFT of turn 1 and of later turns (ms),
        output throughput (tok/s), the busiest replica's share of requests."""
        out = []
        for policy, runs in self.runs.groupby("policy", sort=False):
            req = self.requests[(self.requests["policy"] == policy) & self.requests["ok"].astype(bool)]
            reps = self.replicas[self.replicas["policy"] == policy]
            by_replica = reps.groupby("replica")["requests"].sum()
            out.append({"policy": policy, "hit_rate": runs["hit_rate"].mean(),
                        "hit_rate_min": runs["hit_rate"].min(), "hit_rate_max": runs["hit_rate"].max(),
                        "ttft_turn1_ms": 1000 * req[req["turn"] == 1]["ttft_s"].mean(),
                        "ttft_later_ms": 1000 * req[req["turn"] > 1]["ttft_s"].mean(),
                        "throughput_tok_s": runs["throughput_tok_s"].mean(),
                        "busiest_replica_share": (by_replica.max() / by_replica.sum()) if by_replica.sum() else None,
                        "failed": int(runs["failed"].sum()), "repeats": len(runs)})
        return pd.DataFrame(out)

    def per_replica(self) -> pd.DataFrame:
        """Per policy and replica (summed over repeats): hit rate and requests served."""
        counts = ["prefix_queries", "prefix_hits", "requests"]
        grouped = self.replicas.groupby(["policy", "replica"], sort=False)[counts].sum().round().astype(int)  # counters
        grouped["hit_rate"] = grouped["prefix_hits"] / grouped["prefix_queries"].where(grouped["prefix_queries"] > 0)
        return grouped.reset_index()

    def ttft_per_turn(self) -> pd.DataFrame:
        """Mean TTFT (ms) per policy (rows) and turn (columns), completed requests only."""
        ok = self.requests[self.requests["ok"].astype(bool)]
        return (1000 * ok.pivot_table(index="policy", columns="turn", values="ttft_s", aggfunc="mean", sort=False)).round(1)

    def samples(self, column: str) -> dict[str, list[float]]:
        """One value per run of each policy (``hit_rate``, ``throughput_tok_s``, ``ttft_later_s``)."""
        return {p: list(g[column]) for p, g in self.runs.groupby("policy", sort=False)}


def measure_policy(engine: "ReplicaSet", policy: str, workload: AgentWorkload, salt: int) -> dict[str, Any]:
    """One run: the router on ``policy`` (replicas kept), the workload with fresh content, the counters around it."""
    engine.set_policy(policy)
    urls = engine.metrics_urls()
    router_before = engine.router.read_figures()
    before = replica_snapshots(urls)
    t0 = time.perf_counter()
    rows = run_sync(lambda: arun_agent_workload(engine.settings.base_url, engine.model, workload, salt,
                                                engine.settings.auth_headers()))
    duration = time.perf_counter() - t0
    after = replica_snapshots(urls)
    frame = requests_frame(rows, t0)
    reps = replica_rows(before, after)
    ok = frame[frame["ok"].astype(bool)] if not frame.empty else frame
    later = ok[ok["turn"] > 1]["ttft_s"] if not ok.empty else pd.Series(dtype=float)
    return {"replicas": reps, "requests": frame, "duration_s": duration, "hit_rate": total_hit_rate(reps),
            "throughput_tok_s": (ok["completion_tokens"].fillna(0).sum() / duration) if duration > 0 and not ok.empty else 0.0,
            "ttft_later_s": later.mean() if len(later) else None, "failed": account(frame)["failed"],
            "router": figure_deltas(router_before, engine.router.read_figures())}


def compare_policies(engine: "ReplicaSet", policies: tuple[str, ...] = POLICY_ORDER, workload: AgentWorkload | None = None,
                     repeats: int = 1, seed: int | None = None, progress: bool | None = None) -> PolicyComparison:
    """Each policy ``repeats`` times, the order rotated each round (A B C, B C A ...), fresh content every run."""
    from helpers.core.progress import steps

    workload = workload or AgentWorkload()
    workload.validate()
    base = secrets.randbits(24) if seed is None else seed
    order = [(r, policies[(i + r) % len(policies)]) for r in range(max(1, repeats)) for i in range(len(policies))]
    rep_rows, req_frames, run_rows = [], [], []
    for n, (r, policy) in enumerate(steps(order, "routing policies", "run", progress,
                                          label=lambda step: f"{step[1]}, round {step[0] + 1}")):
        run = measure_policy(engine, policy, workload, salt=base * 100 + n)
        rep_rows += [{"repeat": r, "policy": policy, **row} for row in run["replicas"]]
        req_frames.append(run["requests"].assign(repeat=r, policy=policy))
        run_rows.append({"repeat": r, "policy": policy, **{k: run[k] for k in ("duration_s", "hit_rate", "throughput_tok_s",
                                                                               "ttft_later_s", "failed")}})
    return PolicyComparison(pd.DataFrame(rep_rows), pd.concat(req_frames, ignore_index=True), pd.DataFrame(run_rows),
                            workload, engine.n)


def conclude_affinity(hit_rates: dict[str, list[float]], affinity: str = AFFINITY,
                      baseline: str = BASELINE) -> Conclusion:
    """Session affinity against round robin on the prefix-cache hit rate (fractions, one per run)."""
    expectation = f"{affinity} keeps each conversation on one replica, so more prompt tokens hit its cache than with {baseline}"
    if not hit_rates.get(affinity) or not hit_rates.get(baseline):
        return Conclusion(f"{affinity} or {baseline} was not measured", WITHIN_NOISE, expectation)
    verdict = compare_samples(hit_rates[baseline], hit_rates[affinity], higher_is_better=True)
    text = (f"{affinity} hit rate {verdict.mean_b:.1%} vs {baseline} {verdict.mean_a:.1%} "
            f"({verdict.describe()})")
    if lesson_verdict(verdict) == NOT_SHOWN:
        text += ": affinity did not help here; were the conversations short, or one replica holding every session?"
    return Conclusion(text, lesson_verdict(verdict), expectation)


def conclude_later_turns(ttft_later_s: dict[str, list[float]], affinity: str = AFFINITY,
                         baseline: str = BASELINE) -> Conclusion:
    """TTFT of turns 2+ (seconds, one mean per run): lower with affinity when cache hits skip the prefill."""
    expectation = f"turns 2+ start sooner with {affinity} (their history is already in the replica's cache)"
    if not ttft_later_s.get(affinity) or not ttft_later_s.get(baseline):
        return Conclusion(f"{affinity} or {baseline} was not measured", WITHIN_NOISE, expectation)
    verdict = compare_samples(ttft_later_s[baseline], ttft_later_s[affinity], higher_is_better=False)
    text = (f"later-turn TTFT {1000 * verdict.mean_b:.0f} ms with {affinity} vs {1000 * verdict.mean_a:.0f} ms with "
            f"{baseline} ({verdict.describe()})")
    if lesson_verdict(verdict) != SHOWN:
        text += "; on a shared CPU the replicas slow each other, and a short prompt's prefill is cheap, so cache hits may not show in time"
    return Conclusion(text, lesson_verdict(verdict), expectation)


def cpu_caveat(n_replicas: int, cores: int) -> str:
    """Why total throughput does not grow with replicas on this machine."""
    return (f"These {n_replicas} replicas share this machine's {cores} CPU cores (and its memory bandwidth): a replica "
            "adds no compute, so total throughput cannot grow the way it would with one GPU per replica. What routing "
            "changes here is where the cache hits land and how soon later turns start.")


def gpu_expectation(n_replicas: int) -> str:
    """The GPU expectation, labelled as an estimate, not a measurement."""
    return (f"Estimate, not measured: with one GPU per replica, throughput scales close to {n_replicas}x for "
            "independent requests; session affinity then matters more, because a cache miss re-runs the prefill of the "
            "whole conversation on a GPU that is busy with other sessions.")


def mean_or_none(values: list[float]) -> float | None:
    """The mean of the values that are numbers, None when there are none."""
    clean = [v for v in values if v is not None and v == v]
    return statistics.fmean(clean) if clean else None


def per_replica_report(engine: "ReplicaSet", before: list[Any]) -> pd.DataFrame:
    """Since ``before`` (``replica_snapshots(engine.metrics_urls())``): per replica its port, requests finished,
    tokens generated, prefix-cache hit rate and router health (``workshop bench`` through a replica set)."""
    rows = replica_rows(before, replica_snapshots(engine.metrics_urls()))
    figures = engine.router.read_figures()
    for row, port, url in zip(rows, engine.ports, engine.worker_urls()):
        row["port"] = port
        row["router_health"] = figures.get(f"vllm_router_worker_health{{worker={url}}}")
    return pd.DataFrame(rows)[["replica", "port", "requests", "generation_tokens", "prefix_queries", "hit_rate",
                               "router_health"]]


# ---------------------------------------------------------------- what the CPU split costs

def split_cost_runs(engine: "ReplicaSet", single_base_url: str, workload: AgentWorkload | None = None,
                    repeats: int = 2, seed: int | None = None, progress: bool | None = None) -> pd.DataFrame:
    """The same workload (fresh content each run) through one engine alone (``single_base_url``) and through the
    replica set's router, interleaved A/B/A/B: one row per run with output tok/s, requests/s, mean TTFT and
    end-to-end latency (ms) and failures."""
    from helpers.core.progress import steps

    workload = workload or AgentWorkload(conversations=8, turns=3, concurrency=4)
    base = secrets.randbits(24) if seed is None else seed
    sides = {"one engine": single_base_url, f"{engine.n} replicas + router": engine.settings.base_url}
    order = [(r, name) for r in range(max(1, repeats)) for name in sides]
    out = []
    for n, (r, name) in enumerate(steps(order, "one engine vs replicas", "run", progress,
                                        label=lambda step: f"{step[1]}, round {step[0] + 1}")):
        t0 = time.perf_counter()
        rows = run_sync(lambda: arun_agent_workload(sides[name], engine.model, workload, base * 100 + n,
                                                    engine.settings.auth_headers()))
        duration = time.perf_counter() - t0
        frame = requests_frame(rows, t0)
        ok = frame[frame["ok"].astype(bool)]
        out.append({"round": r, "setup": name, "throughput_tok_s": ok["completion_tokens"].fillna(0).sum() / duration,
                    "requests_per_s": len(ok) / duration, "ttft_ms": 1000 * ok["ttft_s"].mean(),
                    "e2e_ms": 1000 * ok["e2e_s"].mean(), "failed": len(frame) - len(ok)})
    return pd.DataFrame(out)


def conclude_split_cost(runs: pd.DataFrame) -> Conclusion:
    """Throughput of the replicas against one engine on the same cores (``split_cost_runs``), against the spread."""
    sides = list(dict.fromkeys(runs["setup"]))
    single, replicas = runs[runs["setup"] == sides[0]], runs[runs["setup"] == sides[-1]]
    verdict = compare_samples(list(single["throughput_tok_s"]), list(replicas["throughput_tok_s"]))
    return Conclusion(f"{sides[-1]}: {verdict.mean_b:.1f} output tok/s vs {verdict.mean_a:.1f} for {sides[0]} on the "
                      f"same cores ({verdict.describe()}): splitting the cores adds no compute, and each replica "
                      "brings its own API server to feed", "", "")
