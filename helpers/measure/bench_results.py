"""A load run as tables: one row per request, one summary per run, saved as JSON and CSV.

The summary uses the field names of ``vllm bench serve --save-result`` wherever the meaning is the same
(``request_throughput``, ``output_throughput``, ``total_token_throughput``, ``mean_ttft_ms``,
``median_ttft_ms``, ``std_ttft_ms``, ``p99_ttft_ms``, ... for ttft, tpot, itl, e2el, client_queue_time and
e2el_including_client_queue; ``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``,
``duration``, ``request_goodput``, ``request_rate``, ``burstiness``, ``max_concurrency``), with vLLM's
percentile naming (``p{int(p)}_<metric>_ms``, numpy's linear interpolation). Where the figures differ:

- ``ttft``: first token on any channel (content, reasoning, tool call); vLLM's chat path stops at the
  role-only first chunk, which vLLM's server writes in the same step as the first token's chunk.
  ``tpot`` and ``e2el`` are vLLM's (issue 32): the request's ``latency`` is send -> the last chunk with
  ``choices`` (the finish chunk included, the usage-only chunk and ``[DONE]`` not), and
  TPOT = (latency - ttft)/(tokens - 1) per request, tokens from the server's usage
  (``vllm_latency_s``, ``vllm_tpot_s``). ``itl`` is vLLM's too: the gaps between consecutive chunks with
  ``choices`` (role-only and finish chunks and chunks of empty text included), pooled over the requests
  (``vllm_itl_s``); ``itl_per_token`` stays ours, over token-carrying chunks.
- A statistic over no values is None (vLLM writes 0: the "median TTFT of 0" trap).
- Our own fields, under their own names: ``*_ttfot_ms`` (first visible content), ``*_itl_per_token_ms``
  (each chunk gap spread over its tokens), ``mean_tokens_per_chunk``, ``max_tokens_per_chunk``,
  ``median_tokens_per_s_per_user``, ``client_loop_lag_{mean,p99,max}_ms``, ``client_max_inflight``,
  ``cancelled``, ``interrupted``, ``stop_reason``, ``error_counts``, ``prompt_len_method``, and the
  server's own view of the window as ``server_*`` (see helpers/measure/server_metrics.py).
- ``spec_decode_acceptance_rate`` is in PERCENT, as vLLM writes it (server_metrics uses fractions).

JSON files hold one summary per line (JSON Lines), as ``vllm bench serve --append-result`` writes them.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from helpers.measure.loadgen import LoadResult, RequestRecord

PERCENTILES = (50, 90, 95, 99)
SLO_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s", "ttfot": "ttfot_s"}
CLIENT_LAG_WARN_MS = 10.0  # p99 sleep overshoot of the client's loop above this: the client is busy


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def latency_stats(name: str, values_s: Iterable[float | None],
                  percentiles: Iterable[float] = PERCENTILES) -> dict[str, float | None]:
    """mean/median/std/pXX of ``values_s`` in milliseconds, named like vLLM: ``p99_<name>_ms``."""
    values = np.asarray([v for v in values_s if v is not None], dtype=float) * 1000.0
    empty = values.size == 0
    out: dict[str, float | None] = {
        f"mean_{name}_ms": None if empty else float(values.mean()),
        f"median_{name}_ms": None if empty else float(np.median(values)),
        f"std_{name}_ms": None if empty else float(values.std()),
    }
    for p in percentiles:
        out[f"p{_p_word(p)}_{name}_ms"] = None if empty else float(np.percentile(values, p))
    return out


def parse_slos(slos: dict[str, float] | None) -> dict[str, float]:
    """SLOs in ms, keyed ttft / tpot / e2el / ttfot (``ttft_ms`` also accepted) -> {timing attr: seconds}."""
    out: dict[str, float] = {}
    for key, value in (slos or {}).items():
        base = key.removesuffix("_ms")
        if base not in SLO_KEYS:
            raise ValueError(f"unknown SLO {key!r}: use {', '.join(k + '_ms' for k in SLO_KEYS)} (milliseconds)")
        if not value > 0:
            raise ValueError(f"SLO {key} must be > 0 ms (got {value})")
        out[SLO_KEYS[base]] = float(value) / 1000.0
    return out


def meets_slos(record: RequestRecord, slos_s: dict[str, float]) -> bool:
    """A completed request within every SLO (a missing TPOT, one output token, passes as in vLLM)."""
    if not record.timing.ok:
        return False
    for attr, limit in slos_s.items():
        value = _vllm_value(record, attr)
        if value is None and attr == "tpot_s":
            continue
        if value is None or value > limit:
            return False
    return True


def vllm_latency_s(record: RequestRecord) -> float | None:
    """vllm bench serve's request ``latency`` in seconds: sent -> last chunk with ``choices``.

    The definition of vllm/benchmarks/lib/endpoint_request_func.py (async_request_openai_chat_completions:
    ``output.latency = most_recent_timestamp - st``), adopted for issue 32; a record without that arrival
    (one not streamed by the load generator) keeps send -> end of stream.
    """
    t = record.timing
    if not record.choice_times:
        return t.e2e_s
    return record.choice_times[-1] - t.t_sent


def vllm_tpot_s(record: RequestRecord) -> float | None:
    """vllm bench serve's TPOT in seconds: (latency - ttft) / (output tokens - 1), None under 2 tokens.

    vllm/benchmarks/serve.py calculate_metrics (``latency_minus_ttft / (output_len - 1)``), adopted for
    issue 32: the time after the first token, finish chunk included, over the tokens after the first.
    """
    t = record.timing
    if not record.choice_times:
        return t.tpot_s
    latency, ttft = vllm_latency_s(record), t.ttft_s
    if latency is None or ttft is None or t.completion_tokens < 2:
        return None
    return (latency - ttft) / (t.completion_tokens - 1)


def vllm_itl_s(record: RequestRecord) -> list[float]:
    """vllm bench serve's ITL samples in seconds: the gaps between consecutive chunks with ``choices``.

    vllm/benchmarks/lib/endpoint_request_func.py (``output.itl.append(timestamp - most_recent_timestamp)`` for
    every chunk with choices after the first), adopted for issue 32; a record without those arrivals keeps the
    gaps between token-carrying chunks.
    """
    if not record.choice_times:
        return record.timing.itl_chunk_s
    return [b - a for a, b in zip(record.choice_times, record.choice_times[1:])]


def _vllm_value(record: RequestRecord, attr: str) -> float | None:
    """A request's figure for an SLO: vLLM's TPOT and e2el, the timing's own for the others."""
    if attr == "tpot_s":
        return vllm_tpot_s(record)
    if attr == "e2e_s":
        return vllm_latency_s(record)
    return getattr(record.timing, attr)


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def requests_frame(result: LoadResult) -> pd.DataFrame:
    """One row per measured request (failed ones included, with their error); times in ms."""
    rows = []
    for r in result.requests:
        t = r.timing
        tpot, latency = vllm_tpot_s(r), vllm_latency_s(r)
        user_rate = None if not tpot else 1.0 / tpot
        rows.append({
            "index": r.index, "conversation": r.conversation, "turn": r.turn, "ok": t.ok,
            "error": t.error, "cancelled": r.cancelled,
            "scheduled_s": None if t.t_scheduled is None else t.t_scheduled - result.t_start,
            "sent_s": t.t_sent - result.t_start,
            "client_queue_ms": _ms(t.client_queue_s),
            "first_byte_ms": _ms(None if t.t_first_byte is None else t.t_first_byte - t.t_sent),
            "ttft_ms": _ms(t.ttft_s), "ttfot_ms": _ms(t.ttfot_s), "tpot_ms": _ms(tpot),
            "e2el_ms": _ms(latency),
            "e2el_including_client_queue_ms": _ms(None if latency is None else latency + t.client_queue_s),
            "prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens,
            "input_len_target": r.input_len_target, "output_len_target": r.output_len_target,
            "chunks": len(t.chunk_times), "max_tokens_per_chunk": max(t.chunk_tokens, default=0),
            "tokens_per_s_user": user_rate, "finish_reason": t.finish_reason,
        })
    return pd.DataFrame(rows)


def _error_counts(records: list[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        key = (r.timing.error or "no token received")[:160]
        counts[key] = counts.get(key, 0) + 1
    return counts


def _traffic(result: LoadResult) -> dict[str, Any]:
    load = result.load
    if load.rate is None:  # closed loop = vLLM's --request-rate inf --max-concurrency C
        return {"request_rate": "inf", "burstiness": load.burstiness, "max_concurrency": load.concurrency}
    rate: Any = "inf" if math.isinf(load.rate) else load.rate
    return {"request_rate": rate, "burstiness": load.burstiness, "max_concurrency": load.max_concurrency}


def _server_fields(result: LoadResult) -> dict[str, Any]:
    out: dict[str, Any] = {}
    server = result.server
    if server:
        out.update({f"server_{k}": v for k, v in server.items() if not isinstance(v, (list, dict))})
        if server.get("spec_decode_num_draft_tokens"):
            rate = server.get("spec_decode_acceptance_rate")
            out.update({
                "spec_decode_acceptance_rate": None if rate is None else rate * 100.0,  # vLLM: percent
                "spec_decode_acceptance_length": server.get("spec_decode_mean_acceptance_length"),
                "spec_decode_num_drafts": int(server.get("spec_decode_num_drafts") or 0),
                "spec_decode_draft_tokens": int(server.get("spec_decode_num_draft_tokens") or 0),
                "spec_decode_accepted_tokens": int(server.get("spec_decode_num_accepted_tokens") or 0),
                "spec_decode_per_position_acceptance_rates": server.get("spec_decode_per_position_acceptance_rate"),
            })
    gauges = result.gauges
    if gauges is not None and len(gauges):
        for col in ("kv_cache_usage", "num_requests_running", "num_requests_waiting"):
            if col in gauges and gauges[col].notna().any():
                out[f"server_{col}_max"] = float(gauges[col].max())
    return out


def summarize(result: LoadResult, slos: dict[str, float] | None = None,
              percentiles: Iterable[float] = PERCENTILES, label: str | None = None) -> dict[str, Any]:
    """The run's summary: vLLM's field names where they mean the same, ours beside them (see module doc)."""
    percentiles = tuple(percentiles)
    slos_s = parse_slos(slos)
    done = result.completed
    failed = result.failed
    timings = [r.timing for r in done]
    duration = result.duration_s
    total_in = sum((t.prompt_tokens if t.prompt_tokens is not None else (r.input_len_target or 0))
                   for r, t in zip(done, timings))
    total_out = sum(t.completion_tokens for t in timings)
    per_s = (lambda v: v / duration) if duration > 0 else (lambda v: None)  # noqa: E731
    chunk_tokens = [k for t in timings for k in t.chunk_tokens]
    lag_ms = np.asarray(result.loop_lag_s, dtype=float) * 1000.0
    tpots = [vllm_tpot_s(r) for r in done]
    latencies = [vllm_latency_s(r) for r in done]
    user_rates = [1.0 / v for v in tpots if v]
    good = sum(meets_slos(r, slos_s) for r in done) if slos_s else None

    out: dict[str, Any] = {
        "date": datetime.fromtimestamp(result.started_at or 0).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat", "backend": "openai-chat", "label": label,
        "model_id": result.model, "base_url": result.base_url, "num_prompts": len(result.requests),
        **_traffic(result),
        "mode": result.load.mode, "concurrency": result.load.concurrency,
        "duration": duration, "completed": len(done), "failed": len(failed),
        "cancelled": sum(r.cancelled for r in result.requests),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": per_s(len(done)),
        "request_goodput": None if good is None else per_s(good),
        "good_requests": good, "goodput_slos_ms": dict(slos) if slos else None,
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
    }
    out.update(latency_stats("ttft", [t.ttft_s for t in timings], percentiles))
    out.update(latency_stats("tpot", tpots, percentiles))
    out.update(latency_stats("itl", [g for r in done for g in vllm_itl_s(r)], percentiles))
    out.update(latency_stats("e2el", latencies, percentiles))
    out.update(latency_stats("client_queue_time", [t.client_queue_s for t in timings], percentiles))
    out.update(latency_stats("e2el_including_client_queue",
                             [None if e is None else e + t.client_queue_s for e, t in zip(latencies, timings)],
                             percentiles))
    out.update(latency_stats("ttfot", [t.ttfot_s for t in timings], percentiles))
    out.update(latency_stats("itl_per_token", [g for t in timings for g in t.itl_token_s], percentiles))
    out.update({
        "mean_tokens_per_chunk": float(np.mean(chunk_tokens)) if chunk_tokens else None,
        "max_tokens_per_chunk": max(chunk_tokens, default=None),
        "median_tokens_per_s_per_user": float(np.median(user_rates)) if user_rates else None,
        "client_loop_lag_mean_ms": float(lag_ms.mean()) if lag_ms.size else None,
        "client_loop_lag_p99_ms": float(np.percentile(lag_ms, 99)) if lag_ms.size else None,
        "client_loop_lag_max_ms": float(lag_ms.max()) if lag_ms.size else None,
        "client_max_inflight": result.max_inflight,
        "warmup_requests": len(result.warmup),
        "prompt_len_method": result.prompt_len_method,
        "interrupted": result.interrupted, "stop_reason": result.stop_reason,
        "error_counts": _error_counts(failed) if failed else {},
    })
    out.update(_server_fields(result))
    return out


def client_lag_warning(summary: dict[str, Any], threshold_ms: float = CLIENT_LAG_WARN_MS) -> str | None:
    """A sentence when the load generator's own loop was too busy to time the server fairly."""
    lag = summary.get("client_loop_lag_p99_ms")
    if lag is None or lag <= threshold_ms:
        return None
    return (f"the client's event loop ran {lag:.0f} ms late (p99): the client, not the server, may limit this run. "
            "Lower the concurrency, or run the client on another machine.")


# ---------------------------------------------------------------- tables and files

TABLE_COLUMNS = ("mode", "concurrency", "request_rate", "max_concurrency", "completed", "failed", "duration",
                 "request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                 "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
                 "median_e2el_ms", "median_client_queue_time_ms", "median_tokens_per_s_per_user",
                 "client_loop_lag_max_ms", "server_kv_cache_usage_max", "server_num_requests_waiting_max",
                 "interrupted")


def sweep_table(summaries: list[dict[str, Any]], columns: Iterable[str] = TABLE_COLUMNS) -> pd.DataFrame:
    """One row per run with the headline columns (absent ones left out)."""
    frame = pd.DataFrame(summaries)
    return frame[[c for c in columns if c in frame.columns]]


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in summary.items()}


def save_json(summaries: dict[str, Any] | list[dict[str, Any]], path: str | Path) -> Path:
    """Write one summary per line (JSON Lines, like vLLM's --append-result); returns the path."""
    items = [summaries] if isinstance(summaries, dict) else list(summaries)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(s, default=_json_default) + "\n" for s in items))
    return path


def load_json(path: str | Path) -> list[dict[str, Any]]:
    """Summaries from a file of ours or of vLLM (one JSON object, or one per line)."""
    text = Path(path).read_text().strip()
    if not text:
        return []
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def save_csv(summaries: dict[str, Any] | list[dict[str, Any]], path: str | Path) -> Path:
    """Write the summaries as CSV, one row per run (lists and dicts as JSON text); returns the path."""
    items = [summaries] if isinstance(summaries, dict) else list(summaries)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([_flat(s) for s in items]).to_csv(path, index=False)
    return path


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)
