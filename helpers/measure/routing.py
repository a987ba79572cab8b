"""Scale-out lessons on a replica set: which routing policy keeps an agent's cache warm, and what a client sees
when a replica dies under load.

- ``AgentWorkload``: multi-turn agent conversations: a system prompt unique to each conversation (and to each
  run: a fresh salt, so one policy never finds the cache another policy warmed), then turns that grow the
  conversation; ``concurrency`` conversations at a time; every request carries the ``X-Session-ID`` header
  that ``consistent_hash`` routes on.
- ``run_agent_workload``: sends it through an endpoint and returns one row per request sent: completed, or
  failed with what the client saw. A request sent is never dropped from the table.
- ``compare_policies``: per policy (interleaved across repeats, the router restarted per policy, the replicas
  kept), each replica's prefix-cache hit rate from its own counters (d hits / d queries), TTFT per turn and
  throughput. ``conclude_affinity`` / ``conclude_later_turns`` judge them against the run-to-run spread.
- ``replica_failure_run``: SIGKILL one replica mid-run, count what completed, failed and was lost, read the
  router's retry and circuit-breaker figures, time the replica's restart and its return to the rotation;
  ``conclude_failure`` applies ``SURVIVAL_RULE``.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import pandas as pd

from helpers.core.comparison import compare_samples
from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion, lesson_verdict
from helpers.measure.loadgen import run_sync
from helpers.engine.router import SESSION_HEADER, describe_failover, figure_deltas
from helpers.measure.server_metrics import MetricsError, scrape, window

if TYPE_CHECKING:
    from helpers.engine.replicas import ReplicaSet

WORDS = ("plan tool call read file write test check result error retry search answer user agent step note "
         "list open close send fetch parse value table row column index cache block token model query reply "
         "task goal state update merge branch commit build run log trace span metric alert owner team").split()
BASELINE, AFFINITY = "round_robin", "consistent_hash"
POLICY_ORDER = ("round_robin", "consistent_hash", "cache_aware")
FAILURE_CONVERSATIONS = 32  # 4 turns, 4 at a time: on a 2-core AMX laptop, a run that outlasts the 6 s detection window
SURVIVAL_RULE = ("A run survives a replica's death when (1) no request is lost: every request sent ends in a "
                 "complete answer or an error the client sees; (2) requests sent after the router has had time "
                 "to notice (the detection window) all complete; (3) the killed replica, restarted, serves "
                 "requests through the router again.")


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
                body = {"model": model, "messages": messages, "max_tokens": workload.max_tokens, "temperature": 0.0,
                        "stream": True, "stream_options": {"include_usage": True}}
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


# ---------------------------------------------------------------- a replica dies under load

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
    expectation = "the service survives one replica's death"
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


# ---------------------------------------------------------------- notebook 07's scale-out sections

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
        run = self.failure
        if run is None or run.t_kill_s is None:
            return Conclusion(self._not_killed() if run else self.skipped or "no failure run", WITHIN_NOISE,
                              "the service survives one replica's death")
        late = run.after_detection()
        return conclude_failure(run.counts, int((~late["ok"].astype(bool)).sum()),
                                None if run.restart_s is None else run.rejoin_s is not None, len(late))

    def failure_story(self) -> str:
        """When the replica was killed, how long its restart and its return to the rotation took, what the router counted."""
        run = self.failure
        if run is None:
            return self.skipped or "No failure run."
        if run.t_kill_s is None:
            return self._not_killed()
        lines = [f"Killed replica {run.killed_replica} (SIGKILL) {run.t_kill_s:.1f} s into the run, router policy "
                 f"{run.policy}; detection window {run.detect_s:g} s."]
        if run.restart_s is not None:
            rejoin = (f"the router sent it a request again {run.rejoin_s:.1f} s later" if run.rejoin_s is not None
                      else "the router did not send it a request again within the wait")
            lines.append(f"Restarted in {run.restart_s:.1f} s (until it served again); {rejoin}.")
        lines.append(describe_failover(run.router, self.worker_urls))
        return "\n".join(lines)

    def _not_killed(self) -> str:
        answers = int(self.failure.requests["ok"].sum()) if self.failure is not None and len(self.failure.requests) else 0
        return (f"No replica was killed: the run ended after {answers} answers, before the kill threshold (lower "
                "KILL_AFTER_ANSWERS or give the run more conversations).")

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
    from helpers.engine.interface import EngineError
    from helpers.engine.replicas import lesson_replica_set, usable_cores
    from helpers.engine.router import RouterError

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
