"""Structured output as an A/B: the agent's JSON tasks answered with and without a JSON-schema ``response_format``.

The ``json`` tasks of an eval suite (``helpers.evals.suite``) ask for a tool call as JSON. Each task is sent twice
per round, once under its schema (vLLM turns ``response_format`` of type ``json_schema`` into a grammar that masks
every token the schema does not allow: xgrammar or guidance, its ``--structured-outputs-config`` backend) and once
free, with the same instruction and no schema. Each answer is scored by the eval's own parser (``suite.score``:
parses, matches the schema, right values) and timed as a stream (time per output token, TTFT). Rounds alternate
the two sides (``helpers.core.comparison.interleave``), so a drift of the machine hits both alike.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

import pandas as pd

from helpers.evals.suite import EvalSettings, Reply, Suite, _request, load_suite, score
from helpers.measure.stream_timing import stream_chat

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab

SCHEMA, FREE = "json_schema", "free"
MODES = (SCHEMA, FREE)


def structured_request(task: Any, suite: Suite, mode: str, settings: EvalSettings | None = None) -> dict[str, Any]:
    """The eval's request options for ``task`` (a ``json`` task), with its ``response_format`` (mode "json_schema")
    or without it (mode "free"): everything else identical."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    kwargs = _request(task, suite, settings or EvalSettings())
    if mode == FREE:
        kwargs.pop("response_format", None)
    elif "response_format" not in kwargs:
        raise ValueError(f"task {task.id} has no response_format: pick the suite's json tasks")
    return kwargs


def answer_row(task: Any, mode: str, text: str | None, completion_tokens: int, tpot_s: float | None,
               ttft_s: float | None, error: str | None) -> dict[str, Any]:
    """One answer scored by the eval's parser (``suite.score``): valid = parses and matches the schema."""
    checks = score(task, Reply(text)) if text is not None and error is None else \
        {"parses": False, "matches_schema": False, "right_values": False}
    return {"id": task.id, "mode": mode, "valid": bool(checks["matches_schema"]), "parses": bool(checks["parses"]),
            "right_values": bool(checks["right_values"]), "completion_tokens": completion_tokens,
            "tpot_ms": None if tpot_s is None else tpot_s * 1000, "ttft_ms": None if ttft_s is None else ttft_s * 1000,
            "error": error, "output": (text or "")[:80]}


def _answer(lab: Lab, task: Any, suite: Suite, mode: str) -> dict[str, Any]:
    kwargs = structured_request(task, suite, mode)
    timing = stream_chat(lab.client, lab.model, task.messages, **kwargs)
    return answer_row(task, mode, timing.text, timing.completion_tokens, timing.tpot_s, timing.ttft_s, timing.error)


def json_tasks(suite: str | Suite = "agent-v1", limit: int | None = None) -> tuple[Suite, list[Any]]:
    """The suite and its ``json`` tasks (the first ``limit``, spread over the tools in the suite's order)."""
    loaded = load_suite(suite) if isinstance(suite, str) else suite
    tasks = [t for t in loaded.tasks if t.category == "json"]
    if not tasks:
        raise ValueError(f"suite {loaded.name} has no json tasks: use agent-v1")
    if limit is not None and limit < len(tasks):  # every k-th task, so each tool keeps its share
        step = len(tasks) / limit
        tasks = [tasks[int(i * step)] for i in range(limit)]
    return loaded, tasks


def run_structured_ab(lab: Lab, suite: str | Suite = "agent-v1", num_tasks: int | None = 10,
                      rounds: int = 3) -> pd.DataFrame:
    """Each json task with and without its schema, ``rounds`` interleaved rounds (schema, free, schema, free ...);
    one row per answer: round, id, mode, valid, parses, right_values, completion_tokens, tpot_ms, ttft_ms."""
    from helpers.core.comparison import interleave

    loaded, tasks = json_tasks(suite, num_tasks)
    runs = {mode: (lambda mode=mode: [_answer(lab, t, loaded, mode) for t in tasks]) for mode in MODES}
    results = interleave(runs, rounds, desc="structured output")
    return pd.DataFrame([{"round": r + 1, **row} for mode in MODES for r, rows in enumerate(results[mode])
                         for row in rows])


def round_medians(frame: pd.DataFrame, column: str = "tpot_ms") -> dict[str, list[float]]:
    """Per mode, the median of ``column`` in each round (one value per round: their spread is the noise)."""
    out: dict[str, list[float]] = {}
    for mode in MODES:
        side = frame[(frame["mode"] == mode) & frame[column].notna()]
        out[mode] = [float(statistics.median(g[column])) for _, g in side.groupby("round") if len(g)]
    return out


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per mode: answers, valid share, parses share, right values share, mean output tokens, the per-round
    median TPOT (ms) and its spread across rounds."""
    medians = round_medians(frame)
    rows = []
    for mode in MODES:
        side = frame[frame["mode"] == mode]
        tpots = medians[mode]
        rows.append({"mode": mode, "answers": len(side), "valid": side["valid"].mean(), "parses": side["parses"].mean(),
                     "right_values": side["right_values"].mean(), "output_tokens": side["completion_tokens"].mean(),
                     "tpot_ms": statistics.fmean(tpots) if tpots else float("nan"),
                     "tpot_ms_min": min(tpots, default=float("nan")), "tpot_ms_max": max(tpots, default=float("nan"))})
    return pd.DataFrame(rows).set_index("mode")
