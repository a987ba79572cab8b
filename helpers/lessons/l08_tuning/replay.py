"""Notebook 08's Go deeper "your own agent as load" (the package re-exports what the notebook uses): the kit's agent
recorded on the running engine, its sessions replayed at a few numbers of users (``helpers.measure.replay``) beside
a synthetic workload of the same request count and mean lengths at the same numbers of users
(``helpers.measure.loadgen``), and what differs, in sentences computed from the run.

``side_by_side`` runs both, interleaved level by level (replay, synthetic, replay, synthetic ...), each run
watched by the server's gauges and counters (``server_metrics.GaugeSampler``), and returns one row per workload and
number of users: the server's prefix-cache hit rate, first-turn and later-turn TTFT, output throughput and how many
requests were in flight on average (Little's law: the requests' summed latency over the run's duration).
The conclusions (``prefix_conclusion``, ``later_turn_conclusion``, ``load_conclusion``, ``knee_conclusion``) take
that table only, so they read the same on a measured run and on a table read back from a file.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Sequence

import pandas as pd

from helpers.core.conclusion import NOT_SHOWN, SHOWN, WITHIN_NOISE, Conclusion
from helpers.core.progress import steps
from helpers.core.settings import state_dir
from helpers.evals.agent import run_agent
from helpers.evals.record import RecordingLab, session_from_run
from helpers.evals.suite import mcnemar_p
from helpers.measure.replay import Recording, ReplayResult, replay, write_recording
from helpers.measure.saturation import find_knee
from helpers.measure.workloads import Load, Workload

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

REPLAY, SYNTHETIC = "replay", "synthetic"
HIT_MARGIN = 0.10  # the replay's hit rate must beat the synthetic one's by this much (a fraction) to count as hits
SIGNIFICANCE = 0.05  # the sign test's level for "later turns faster (or slower) than first turns"
# The recorded agent's instructions: the one system prompt every session sends first, as a real agent sends its own,
# longer than one KV block of vLLM's CPU build (128 tokens) so that the prefix cache can share it.
AGENT_INSTRUCTIONS = (
    "You are the assistant of a small travel desk. Travellers ask about the weather, local time, unit "
    "conversions and arithmetic. Use a tool whenever the answer depends on live data or a calculation: never "
    "guess a temperature, a time or a number. Call one tool at a time, with arguments that match its schema. "
    "When the tool answers, reply in one short sentence that repeats its figure with the unit. If a tool does "
    "not know a city, say so plainly.")
COLUMNS = ("workload", "users", "requests", "failed", "prefix_cache_hit_rate", "output_tok_s", "median_ttft_ms",
           "first_turn_ttft_ms", "later_turn_ttft_ms", "first_turn_prompt_tokens", "later_turn_prompt_tokens",
           "mean_in_flight", "duration_s", "max_prompt_tokens", "min_prompt_tokens", "block_tokens", "prefix_caching")

__all__ = [
    "AGENT_INSTRUCTIONS",
    # the floors below the recording cell uses (the package re-exports them for the notebook)
    "Recording", "RecordingLab", "run_agent", "session_from_run", "state_dir", "steps", "write_recording",
    # this step's own
    "REPLAY", "SYNTHETIC", "COLUMNS", "copy_pairs", "in_flight_mean", "knee_conclusion", "later_turn_conclusion",
           "load_conclusion", "prefix_conclusion", "replay_conclusions", "replay_command", "run_replay",
           "run_synthetic", "side_by_side", "side_by_side_view", "synthetic_workload", "think_time_check"]


# ---------------------------------------------------------------- measuring

def _watched(lab: Lab, run: Any) -> tuple[Any, pd.DataFrame | None, dict[str, Any] | None]:
    """``run()`` with the server's gauges sampled; returns its result, the gauges and the server's window (with the
    engine's cache config, ``cache_config``: its block size and whether prefix caching is on)."""
    from helpers.measure import server_metrics

    sampler = server_metrics.GaugeSampler(lab.settings.metrics_url, 0.5)
    sampler.start()
    try:
        result = run()
    finally:
        frame = sampler.stop()
    window = (server_metrics.window(sampler.first, sampler.last)
              if sampler.first is not None and sampler.last is not None else None)
    if window is not None:
        window["cache_config"] = sampler.last.cache_config()
    return result, frame, window


def run_replay(lab: Lab, recording: Recording, copies: int, think_scale: float = 1.0) -> ReplayResult:
    """``copies`` copies of every recorded session at once on ``lab``'s engine, the server watched
    (``result.load.server``, ``result.load.gauges``)."""
    result, gauges, window = _watched(lab, lambda: replay(lab.settings, recording, copies, think_scale=think_scale))
    result.load.gauges, result.load.server = gauges, window
    return result


def synthetic_workload(recording: Recording) -> Workload:
    """One-turn requests of the recording's mean prompt and completion lengths (tokens), each with its own prefix,
    with the request fields the recording sent (its template arguments)."""
    turns = [t for s in recording.sessions for t in s.turns]
    prompt = round(statistics.fmean(t.prompt_tokens for t in turns))
    output = max(1, round(statistics.fmean(t.completion_tokens for t in turns)))
    extra = dict(recording.sessions[0].request)
    return Workload(input_len=prompt, output_len=output, extra_body=extra)


def run_synthetic(lab: Lab, recording: Recording, users: int, num_requests: int) -> Any:
    """The synthetic workload (``synthetic_workload``) at ``users`` users back to back, ``num_requests`` requests,
    the server watched; a ``LoadResult``."""
    from helpers.measure.loadgen import run_sweep

    (result,) = run_sweep(lab.settings, synthetic_workload(recording), concurrencies=[users],
                          load=Load(num_requests=num_requests), metrics=True)
    return result


def in_flight_mean(spans: Sequence[tuple[float, float]], duration_s: float) -> float | None:
    """Requests in flight on average over a run (Little's law): the summed (sent, done) spans (s) over its duration."""
    if duration_s <= 0:
        return None
    return sum(max(0.0, done - sent) for sent, done in spans) / duration_s


def copy_pairs(turns: pd.DataFrame) -> list[dict[str, float]]:
    """Per replayed copy with a later turn: its first turn's TTFT and prompt, and its later turns' median TTFT and
    mean prompt (ms, tokens); the rows of ``ReplayResult.turns_frame`` that succeeded."""
    ok = turns[turns["ok"] & turns["ttft_ms"].notna()]
    pairs = []
    for _, rows in ok.groupby(["session", "copy"]):
        first, later = rows[rows["turn"] == 1], rows[rows["turn"] > 1]
        if len(first) and len(later):
            pairs.append({"first_ttft_ms": float(first["ttft_ms"].iloc[0]),
                          "later_ttft_ms": float(later["ttft_ms"].median()),
                          "first_prompt_tokens": float(first["prompt_tokens"].iloc[0]),
                          "later_prompt_tokens": float(later["prompt_tokens"].mean())})
    return pairs


def _median(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def _row(workload: str, users: int, summary: dict[str, Any], requests: pd.DataFrame, spans: list[tuple[float, float]],
         duration_s: float, server: dict[str, Any] | None) -> dict[str, Any]:
    """One table row from a run's summary, its requests (columns turn, ok, ttft_ms, prompt_tokens) and the server's
    window."""
    ok = requests[requests["ok"]]
    first, later = ok[ok["turn"] == 1], ok[ok["turn"] > 1]
    cache = (server or {}).get("cache_config") or {}
    return {"workload": workload, "users": users, "requests": len(requests), "failed": int((~requests["ok"]).sum()),
            "prefix_cache_hit_rate": summary.get("server_prefix_cache_hit_rate"),
            "output_tok_s": summary.get("output_throughput"), "median_ttft_ms": summary.get("median_ttft_ms"),
            "first_turn_ttft_ms": _median(first["ttft_ms"].dropna().tolist()),
            "later_turn_ttft_ms": _median(later["ttft_ms"].dropna().tolist()),
            "first_turn_prompt_tokens": float(first["prompt_tokens"].mean()) if len(first) else None,
            "later_turn_prompt_tokens": float(later["prompt_tokens"].mean()) if len(later) else None,
            "mean_in_flight": in_flight_mean(spans, duration_s), "duration_s": duration_s,
            "max_prompt_tokens": float(ok["prompt_tokens"].max()) if len(ok) else None,
            "min_prompt_tokens": float(ok["prompt_tokens"].min()) if len(ok) else None,
            "block_tokens": cache.get("block_size"), "prefix_caching": cache.get("enable_prefix_caching")}


def side_by_side(lab: Lab, recording: Recording, copies: Sequence[int], think_scale: float = 1.0,
                 progress: bool | None = None) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The replay at each number of ``copies`` (users: copies x sessions) and the synthetic workload at the same users
    with the same request count, interleaved; the table (``COLUMNS``) and the replay's per-copy pairs (``copy_pairs``,
    with ``users``)."""
    from helpers.measure.bench_results import summarize

    sessions = len(recording.sessions)
    order = [(kind, c) for c in copies for kind in (REPLAY, SYNTHETIC)]
    rows, pairs = [], []
    requests_at: dict[int, int] = {}
    for kind, c in steps(order, "agent vs synthetic", "run", progress, label=lambda s: f"{s[0]}, {s[1] * sessions} users"):
        users = c * sessions
        if kind == REPLAY:
            result = run_replay(lab, recording, c, think_scale)
            turns = result.turns_frame()
            requests_at[c] = len(turns)
            spans = [(r.timing.t_sent, r.timing.t_done) for r in result.load.requests if r.timing.t_done]
            rows.append(_row(REPLAY, users, result.summary(), turns, spans, result.load.duration_s, result.load.server))
            pairs.extend({"users": users, **p} for p in copy_pairs(turns))
        else:
            load = run_synthetic(lab, recording, users, requests_at[c])
            requests = pd.DataFrame([{"turn": 1, "ok": r.timing.ok, "prompt_tokens": r.timing.prompt_tokens,
                                      "ttft_ms": None if r.timing.ttft_s is None else r.timing.ttft_s * 1000}
                                     for r in load.requests])
            spans = [(r.timing.t_sent, r.timing.t_done) for r in load.requests if r.timing.t_done]
            rows.append(_row(SYNTHETIC, users, summarize(load), requests, spans, load.duration_s, load.server))
    return pd.DataFrame(rows, columns=list(COLUMNS)), pairs


def side_by_side_view(table: pd.DataFrame) -> pd.DataFrame:
    """The table with one row per number of users and each figure's replay and synthetic value side by side."""
    figures = ["prefix_cache_hit_rate", "first_turn_ttft_ms", "later_turn_ttft_ms", "output_tok_s", "mean_in_flight"]
    wide = table.pivot(index="users", columns="workload", values=figures)
    wide.columns = [f"{figure} ({kind})" for figure, kind in wide.columns]
    keep = [c for c in wide.columns if not (c.startswith("later_turn") and c.endswith(f"({SYNTHETIC})"))]
    return wide[keep].round(2)


def replay_command(path: Any, copies: int = 4) -> str:
    """The one command that replays a recording file (``workshop bench --replay``), printed for the attendee."""
    return f"workshop bench --replay {path} --copies {copies} --think-scale 1 --slo ttft_ms=2000"


# ---------------------------------------------------------------- conclusions (pure: the table and the pairs)

def think_time_check(recording_turns: pd.DataFrame, tool_delay_s: float) -> tuple[bool | None, str]:
    """The recording's later turns waited at least the tool delay (s) before they were sent: (seen, detail)."""
    later = recording_turns[recording_turns["turn"] > 1]
    if later.empty:
        return None, "a later turn was not measured: the agent answered every question in one model call"
    shortest = float(later["think_time_s"].min())
    return bool(shortest >= tool_delay_s), (f"{len(later)} later turn(s), think time {shortest:.2f}-"
                                           f"{float(later['think_time_s'].max()):.2f} s (tool delay {tool_delay_s:g} s)")


def _rows(table: pd.DataFrame, kind: str) -> pd.DataFrame:
    return table[table["workload"] == kind].sort_values("users")


def _pct(value: Any) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:.0%}"


def prefix_conclusion(table: pd.DataFrame, margin: float = HIT_MARGIN) -> Conclusion:
    """Did the replayed agent hit the prefix cache more than the synthetic workload, at every number of users?"""
    expectation = "the replayed agent hits the prefix cache, the synthetic workload does not"
    replayed, synthetic = _rows(table, REPLAY), _rows(table, SYNTHETIC)
    pairs = list(zip(replayed["users"], replayed["prefix_cache_hit_rate"], synthetic["prefix_cache_hit_rate"]))
    text = "server prefix-cache hit rate, replay vs synthetic: " + ", ".join(
        f"{int(u)} users {_pct(r)} vs {_pct(s)}" for u, r, s in pairs)
    if not pairs or any(pd.isna(r) or pd.isna(s) for _, r, s in pairs):
        return Conclusion(text + ": the server's prefix-cache counters were not measured in every run, nothing to "
                          "compare.", WITHIN_NOISE, expectation)
    if all(r >= s + margin for _, r, s in pairs):
        return Conclusion(text + ": every copy re-sends its own history and all share the system prompt and tools, "
                          "so that part of each prompt was computed before; the synthetic prompts each start "
                          "differently.", SHOWN, expectation)
    return Conclusion(text + f": the replay is not ahead by {margin:.0%} at every number of users; "
                      + _no_hits_reason(replayed), NOT_SHOWN, expectation)


def _no_hits_reason(replayed: pd.DataFrame) -> str:
    """Why a replay found little in the prefix cache, from its rows' cache config and prompt lengths."""
    caching = replayed["prefix_caching"].dropna().tolist() if "prefix_caching" in replayed else []
    if caching and not any(bool(c) for c in caching):
        return "prefix caching is off on this engine (--enable-prefix-caching)."
    blocks = replayed["block_tokens"].dropna().tolist() if "block_tokens" in replayed else []
    longest = replayed["max_prompt_tokens"].dropna().max() if "max_prompt_tokens" in replayed else float("nan")
    shortest = replayed["min_prompt_tokens"].dropna().min() if "min_prompt_tokens" in replayed else float("nan")
    if blocks and not pd.isna(longest) and longest < 2 * max(blocks):
        block = int(max(blocks))
        return (f"the sessions' prompts ({shortest:,.0f}-{longest:,.0f} tokens) span one or two KV blocks of {block} "
                "tokens, and the cache reuses only full blocks computed before, so there was almost nothing to reuse. "
                "A longer shared prefix (a system prompt, tool schemas, a long history) or smaller blocks (vLLM's 16 "
                "on a GPU; the CPU build's default is 128) is what the cache saves.")
    return "the copies' prompts share too little, or the KV cache did not keep their blocks between turns."


def later_turn_conclusion(pairs: Sequence[dict[str, float]], table: pd.DataFrame,
                          level: float = SIGNIFICANCE) -> Conclusion:
    """Per replayed copy, were its later turns' first tokens sooner than its first turn's (a sign test over copies),
    though their prompts are longer?"""
    expectation = "later turns start no later than the first, though their prompts are longer"
    if not pairs:
        return Conclusion("no replayed copy had a later turn: later turns were not measured.", WITHIN_NOISE,
                          expectation)
    faster = sum(p["later_ttft_ms"] < p["first_ttft_ms"] for p in pairs)
    slower = sum(p["later_ttft_ms"] > p["first_ttft_ms"] for p in pairs)
    p_value = mcnemar_p(slower, faster)
    grown = statistics.fmean(p["later_prompt_tokens"] - p["first_prompt_tokens"] for p in pairs)
    first = statistics.median(p["first_ttft_ms"] for p in pairs)
    later = statistics.median(p["later_ttft_ms"] for p in pairs)
    hits = _rows(table, REPLAY)["prefix_cache_hit_rate"].dropna()
    hit = f", prefix-cache hit rate {hits.min():.0%}-{hits.max():.0%}" if len(hits) else ""
    text = (f"over {len(pairs)} replayed copies, later turns' median TTFT {later:,.1f} ms vs first turns' "
            f"{first:,.1f} ms, with prompts {grown:+,.0f} tokens longer; later turn sooner in {faster}, later in "
            f"{slower} (sign test p = {p_value:.2g}{hit})")
    if p_value < level and faster > slower:
        cached = len(hits) and hits.min() >= HIT_MARGIN
        why = ("the longer history costs no prefill, it is in the cache; and later turns arrive spread out by think "
               "time, where every copy's first turn arrives at once." if cached else
               "not the cache's doing here (too few hits): later turns arrive spread out by think time, where every "
               "copy's first turn arrives at once and waits behind the others.")
        return Conclusion(text + ": " + why, SHOWN, expectation)
    if p_value < level:
        return Conclusion(text + ": later turns wait longer here, beyond chance: their new tokens (the tool results) "
                          "and the other copies' work in the engine outweigh what the cache saves.", NOT_SHOWN,
                          expectation)
    return Conclusion(text + ": no difference beyond chance: the extra tokens cost nothing measurable, and the copies' "
                      "TTFTs vary more than the turns differ.", WITHIN_NOISE, expectation)


def load_conclusion(table: pd.DataFrame) -> Conclusion:
    """At the same number of users, did the replay keep fewer requests in flight than the synthetic workload?"""
    expectation = "at the same number of users the agent keeps fewer requests in flight"
    replayed, synthetic = _rows(table, REPLAY), _rows(table, SYNTHETIC)
    rows = [(int(u), r, s, rt, st) for u, r, s, rt, st in zip(
        replayed["users"], replayed["mean_in_flight"], synthetic["mean_in_flight"], replayed["output_tok_s"],
        synthetic["output_tok_s"]) if not (pd.isna(r) or pd.isna(s))]
    if not rows:
        return Conclusion("requests in flight were not measured.", WITHIN_NOISE, expectation)
    text = "requests in flight on average, replay vs synthetic: " + ", ".join(
        f"{u} users {r:.1f} vs {s:.1f} ({rt:,.0f} vs {st:,.0f} output tok/s)" for u, r, s, rt, st in rows)
    if all(r < s for _, r, s, _, _ in rows):
        return Conclusion(text + ": each replayed user waits its recorded think time between turns, so a number of "
                          "users sized on the synthetic sweep overstates what an agent's users send.", SHOWN,
                          expectation)
    return Conclusion(text + ": the replay kept as many requests in flight or more at some number of users, so its "
                      "think time was short beside its requests' latency here.", NOT_SHOWN, expectation)


def knee_conclusion(table: pd.DataFrame) -> Conclusion:
    """Where each workload's throughput stops growing (``saturation.find_knee``), from the table."""
    parts, knees = [], {}
    for kind in (SYNTHETIC, REPLAY):
        rows = _rows(table, kind)
        users, speed, ttft = rows["users"].tolist(), rows["output_tok_s"].tolist(), rows["median_ttft_ms"].tolist()
        knee = find_knee(users, speed, ttft) if len(users) >= 2 else None
        knees[kind] = None if knee is None else int(users[knee])
        curve = " -> ".join("n/a" if pd.isna(s) else f"{s:,.0f}" for s in speed)
        where = (f"knee at {knees[kind]} users" if knee is not None else
                 "no knee within these levels" if len(users) >= 2 else "one level: no knee to find")
        parts.append(f"{kind} {curve} output tok/s over {', '.join(str(int(u)) for u in users)} users ({where})")
    synthetic, replayed = knees[SYNTHETIC], knees[REPLAY]
    if synthetic is None and replayed is None:
        tail = ("neither stopped growing within these levels, so this run places no knee: add a higher level "
                "(REPLAY_COPIES) to find one")
    elif replayed is None:
        tail = (f"the synthetic workload saturates after {synthetic} users, the agent's not within these levels: "
                "sized on the synthetic sweep, the engine would be given fewer users than an agent's load allows")
    elif synthetic is None:
        tail = (f"the agent saturates after {replayed} users, the synthetic workload not within these levels: "
                "sized on the synthetic sweep, the engine would be given more users than an agent's load allows")
    else:
        tail = f"the knee lies at {replayed} users for the agent and {synthetic} for the synthetic workload"
    return Conclusion("; ".join(parts) + f". {tail[0].upper()}{tail[1:]}.")


def replay_conclusions(table: pd.DataFrame | None, pairs: Sequence[dict[str, float]]) -> list[Conclusion]:
    """The section's sentences, or one saying it did not run."""
    if table is None or table.empty:
        return [Conclusion("your own agent as load: not run in this session.")]
    return [prefix_conclusion(table), later_turn_conclusion(pairs, table), load_conclusion(table),
            knee_conclusion(table)]
