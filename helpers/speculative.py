"""Speculative decoding: build the ``--speculative-config`` of a method and measure one configuration.

A draft proposes ``num_speculative_tokens`` tokens; the target model checks them all in one forward
pass and keeps the longest agreeing prefix plus one token of its own. The server counts drafts, draft
tokens and accepted tokens (``helpers.server_metrics``); the client sees several tokens arrive per
chunk. Greedy outputs do not change: speculation is lossless, only faster or slower.
"""

from __future__ import annotations

import json
from typing import Any

from helpers.bench_results import requests_frame, summarize
from helpers.evals import load_suite
from helpers.loadgen import Load, Workload, run_load
from helpers.server_metrics import scrape, window
from helpers.settings import models_dir


def spec_config(method: str, num_speculative_tokens: int, model: str | None = None, **options: Any) -> str:
    """The JSON for ``--speculative-config``: ``ngram`` (prompt lookup) or ``draft_model`` (a model name:
    a shipped tiny model's directory when one exists under models/, else a hub id)."""
    if num_speculative_tokens < 1:
        raise ValueError("num_speculative_tokens must be >= 1")
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": num_speculative_tokens, **options}
    if method == "draft_model":
        if not model:
            raise ValueError("method draft_model needs model= (a draft sharing the target's tokenizer)")
        path = models_dir() / model
        config["model"] = str(path) if path.is_dir() else model
    elif method == "ngram":
        config.setdefault("prompt_lookup_max", 4)
        config.setdefault("prompt_lookup_min", 2)
    else:
        raise ValueError(f"unknown method {method!r}: use 'ngram' or 'draft_model'")
    return json.dumps(config, separators=(",", ":"))


def agent_workload(suite: str = "agent-v1", max_tokens: int = 64,
                   categories: tuple[str, ...] = ("tool_call", "tool_answer", "no_tool")) -> Workload:
    """Real agent traffic: the eval suite's conversations, asked with the tools, answered as the model
    would (no forced length). What a draft has to guess depends on what is said, so acceptance is only
    meaningful on such traffic; on random-text prompts two models that both fall into repeating one
    token "agree" (see ../shared/reference/cpu-lab.md)."""
    loaded = load_suite(suite)
    prompts = [t.messages for t in loaded.tasks if t.category in categories and t.tools]
    return Workload(output_len=max_tokens, exact_output=False, prompts=prompts, extra_body={"tools": loaded.tools})


def measure_speculation(lab: Any, name: str, concurrencies: list[int], workload: Workload,
                        requests_per_stream: int = 4, min_requests: int = 8) -> list[dict[str, Any]]:
    """One row per concurrency: throughput, TTFT/TPOT, tokens per chunk seen by the client, and the
    server's acceptance rate and mean acceptance length over that run (None without speculation)."""
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
                     "failed": s["failed"]})
    return rows
