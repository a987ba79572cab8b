"""Notebook 06's measurements: real agent traffic, one load run per concurrency with the server's spec-decode
counters, the methods interleaved with the baseline (each a restart with its ``--speculative-config``), and the
run tables averaged."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd

from helpers.core.comparison import interleave
from helpers.core.vllm_args import flag_value, with_flag
from helpers.evals.suite import load_suite
from helpers.measure.bench_results import requests_frame, summarize
from helpers.measure.loadgen import run_load
from helpers.measure.server_metrics import scrape, window
from helpers.measure.workloads import Load, Workload
from helpers.planning.acceptance import conditional_rates, pooled_per_position

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab


def _mean(values: Any) -> float | None:
    clean = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(clean) / len(clean) if clean else None


def agent_workload(suite: str = "agent-v1", max_tokens: int = 64,
                   categories: tuple[str, ...] = ("tool_call", "tool_answer", "no_tool")) -> Workload:
    """Real agent traffic: the eval suite's conversations, asked with the tools, answered as the model
    would (no forced length). What a draft has to guess depends on what is said, so acceptance is only
    meaningful on such traffic; on random-text prompts two models that both fall into repeating one
    token "agree"."""
    loaded = load_suite(suite)
    prompts = [t.messages for t in loaded.tasks if t.category in categories and t.tools]
    return Workload(output_len=max_tokens, exact_output=False, prompts=prompts, extra_body={"tools": loaded.tools})


def measure_speculation(lab: Lab, name: str, concurrencies: list[int], workload: Workload,
                        requests_per_stream: int = 4, min_requests: int = 8) -> list[dict[str, Any]]:
    """One row per concurrency: throughput, TTFT/TPOT, tokens per chunk seen by the client, and the
    server's acceptance rate and mean acceptance length over that run, its number of drafts and the acceptance
    rate of each draft position (None without speculation)."""
    rows = []
    for c in concurrencies:
        before = scrape(lab.settings.metrics_url)
        result = run_load(lab.settings, workload, Load(concurrency=c, num_requests=max(min_requests, c * requests_per_stream),
                                                       warmup_requests=min(c, 2)))
        served = window(before, scrape(lab.settings.metrics_url))
        s, frame = summarize(result), requests_frame(result)
        ok = frame[frame["ok"]]
        rows.append({"config": name, "concurrency": c, "output_tok_s": s["output_throughput"],
                     "mean_ttft_ms": s["mean_ttft_ms"], "mean_tpot_ms": s["mean_tpot_ms"],
                     "tokens_per_chunk": float(ok["completion_tokens"].sum() / ok["chunks"].sum()) if len(ok) else None,
                     "acceptance_rate": served["spec_decode_acceptance_rate"],
                     "mean_acceptance_length": served["spec_decode_mean_acceptance_length"],
                     "spec_drafts": served["spec_decode_num_drafts"],
                     "per_position_acceptance": served["spec_decode_per_position_acceptance_rate"],
                     "failed": s["failed"]})
    return rows


BASELINE = "no speculation"


SPEC_FLAG = "--speculative-config"


def run_methods(lab: Lab, methods: dict[str, str | None], concurrencies: list[int], workload: Workload,
                repeats: int = 2, requests_per_stream: int = 4, eval_suite: str | None = None,
                first_round: Callable[[str], Any] | None = None,
                env: dict[str, tuple[tuple[str, str], ...]] | None = None,
                back: bool = True) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Each ``--speculative-config`` (None: no speculation) measured ``repeats`` times, interleaved A B C C B A (a
    round starts on the method the one before ended on: one restart fewer per round), so a machine that gets busier
    hits every method alike. One row per method, concurrency and repeat; ``eval_suite`` runs once per method in the
    first round, and ``first_round(name)`` right after it (e.g. samples for the losslessness test, taken while that
    engine is up). ``env``: engine environment variables a method runs with (e.g. ``spec_sampling_fix.FIX_ENV``),
    the others without them. The engine is left without speculation; with ``back=False`` it stays on the last
    method measured (the caller goes on from there), unless a run failed."""
    from helpers.evals.suite import run_suite

    evals: dict[str, Any] = {}
    rounds = {name: 0 for name in methods}
    managed = {key for pairs in (env or {}).values() for key, _ in pairs}

    def switch(config: str | None, extra: tuple[tuple[str, str], ...] = ()) -> None:
        if not managed:
            if flag_value(lab.engine.args(), SPEC_FLAG) != config:
                lab.engine.set_flag(SPEC_FLAG, config)
            return
        current = lab.engine.config()
        wanted = {k: v for k, v in current.env if k not in managed} | dict(extra)
        if flag_value(current.args, SPEC_FLAG) == config and dict(current.env) == wanted:
            return
        if dict(current.env) == wanted:
            lab.engine.set_flag(SPEC_FLAG, config)
        else:
            lab.engine.apply(replace(current, args=tuple(with_flag(current.args, SPEC_FLAG, config)),
                                     env=tuple(sorted(wanted.items()))))

    def runner(name: str, config: str | None):
        def run() -> list[dict[str, Any]]:
            switch(config, (env or {}).get(name, ()))
            if eval_suite and name not in evals:
                evals[name] = run_suite(lab, eval_suite)
            if first_round is not None and rounds[name] == 0:
                first_round(name)
            rows = measure_speculation(lab, name, concurrencies, workload, requests_per_stream)
            rounds[name] += 1
            return [dict(r, repeat=rounds[name]) for r in rows]
        return run

    finished = False
    try:
        results = interleave({name: runner(name, config) for name, config in methods.items()}, repeats,
                             desc="speculative methods", mirrored=True)
        finished = True
    finally:
        if back or not finished:
            switch(None)  # back to the baseline
    return pd.DataFrame([row for rows in results.values() for run_rows in rows for row in run_rows]), evals


def mean_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The repeats averaged: one row per method and concurrency (for a figure of the means)."""
    columns = ["output_tok_s", "mean_ttft_ms", "mean_tpot_ms", "tokens_per_chunk", "acceptance_rate",
               "mean_acceptance_length"]
    columns = [c for c in columns if c in runs]
    return runs.groupby(["config", "concurrency"], as_index=False, sort=False)[columns].mean()


def per_k(runs: pd.DataFrame, names_by_k: dict[int, str], concurrency: int) -> pd.DataFrame:
    """One row per number of guesses k: the mean throughput and acceptance of the method named for it, and each draft
    position's acceptance given the one before was kept (``conditional``, pooled over its runs by drafts)."""
    rows = []
    for k, name in sorted(names_by_k.items()):
        r = runs[(runs.config == name) & (runs.concurrency == concurrency)]
        _, rates = pooled_per_position(r)
        rows.append({"k": k, "config": name, "runs": len(r), "output_tok_s": _mean(r.output_tok_s),
                     "acceptance_rate": _mean(r.acceptance_rate),
                     "mean_acceptance_length": _mean(r.mean_acceptance_length),
                     "conditional": [round(c, 3) for c in conditional_rates(rates or [])]})
    return pd.DataFrame(rows)


def baseline_tok_s(runs: pd.DataFrame, concurrency: int) -> list[float]:
    """The baseline's output tokens/s in each of its runs at ``concurrency``."""
    return runs[(runs.config == BASELINE) & (runs.concurrency == concurrency)].output_tok_s.tolist()


def complete_rounds(lab: Lab, methods: dict[str, str | None], done: pd.DataFrame, concurrencies: list[int],
                    workload: Workload, repeats: int = 2, requests_per_stream: int = 4, eval_suite: str | None = None,
                    evals: dict[str, Any] | None = None) -> pd.DataFrame:
    """The method grid, interleaved, built on a round already measured (``done``: the core path's baseline and
    aligned draft): first the methods ``done`` lacks, completing round 1, then ``repeats - 1`` full rounds, the
    first of them in reverse (``methods``' last first, its first, the baseline, last), so it starts on the method
    round 1 ended on and ends on the baseline it measures: no restart there, and none to go back. The rows of all
    rounds, ``done``'s included; the new methods' evals go into ``evals``. The engine is left without speculation."""
    measured = set(done.config) if len(done) else set()
    missing = {name: config for name, config in methods.items() if name not in measured}
    parts = [done]
    if missing:
        rows, more = run_methods(lab, missing, concurrencies, workload, 1, requests_per_stream, eval_suite=eval_suite,
                                 back=repeats <= 1)
        parts.append(rows)
        if evals is not None:
            evals.update(more)
    if repeats > 1:
        reverse = dict(reversed(list(methods.items())))
        rows, _ = run_methods(lab, reverse, concurrencies, workload, repeats - 1, requests_per_stream)
        parts.append(rows.assign(repeat=rows.repeat + 1))
    return pd.concat([p for p in parts if len(p)], ignore_index=True)


def stream_chunk_tokens(lab: Lab, workload: Workload, index: int = 0) -> list[int]:
    """The tokens each chunk of one streamed request carried (the server's running count), alone on the engine: at one
    request at a time each chunk is one engine step, so on a speculative engine it reads as that step's kept guesses
    plus the target's own token (``helpers.lessons.l06.picture``). Sent without the tools: a tool parser holds back
    the chunks of a call it is still reading, which would merge steps."""
    from helpers.measure.stream_timing import stream_chat

    messages = workload.prompts[index % len(workload.prompts)]
    timing = stream_chat(lab.client, lab.model, messages, max_tokens=workload.output_len)
    return list(timing.chunk_tokens)
