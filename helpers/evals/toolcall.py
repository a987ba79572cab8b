"""How well the served tiny agent model calls tools on phrasings it never saw in training.

Runs held-out cases (``helpers.tiny.corpus.heldout_cases``) through a real endpoint with the full agent
loop: the call vLLM parsed (structured ``tool_calls``), the function, the arguments, and whether the
final answer, written after the real tool result came back, contains that result's value.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from helpers.tiny import corpus
from helpers.evals.agent import run_agent
from helpers.tiny.tools import evaluate_expression

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab


def arguments_match(name: str, got: Any, expected: dict[str, Any]) -> bool:
    """True when the arguments mean the same (numbers by value, expressions by their result)."""
    if not isinstance(got, dict):
        return False
    if name == "calculator":
        try:
            return math.isclose(evaluate_expression(str(got.get("expression"))),
                                evaluate_expression(expected["expression"]), rel_tol=1e-9)
        except (ValueError, SyntaxError, ZeroDivisionError, TypeError):
            return False
    if name == "convert_units":
        try:
            same_value = math.isclose(float(got.get("value")), float(expected["value"]))
        except (TypeError, ValueError):
            return False
        return same_value and got.get("from_unit") == expected["from_unit"] and got.get("to_unit") == expected["to_unit"]
    return got == expected


def run_case(lab: Lab, example: corpus.Example, thinking: bool = False) -> dict[str, Any]:
    """One held-out case through the agent loop (thinking on or off), scored."""
    question = example.messages[0]["content"]
    run = run_agent(lab, question, max_steps=2, thinking=thinking)
    first = run.steps[0].tool_calls[0] if run.steps and run.steps[0].tool_calls else None
    row: dict[str, Any] = {"kind": example.kind, "question": question, "answer": run.answer,
                           "call": json.dumps({"name": first["name"], "arguments": first["arguments"]}) if first else None,
                           "ended_in_reasoning": run.ended_in_reasoning,
                           "reasoning_tokens": sum(s.reasoning_tokens or 0 for s in run.steps)}
    if example.expected_call is None:  # no tool fits: a plain answer is right
        row.update(structured_call=first is not None, right_function=first is None, right_arguments=first is None,
                   answer_uses_result=None)
        return row
    expected = example.expected_call
    right_fn = first is not None and first["name"] == expected["name"]
    right_args = right_fn and arguments_match(expected["name"], first["arguments"], expected["arguments"])
    uses = None
    if right_args and run.answer is not None:
        result = first["result"]
        values = [str(result[k]) for k in ("temperature_c", "local_time", "result") if k in result]
        if "error" in result:
            values = [str(expected["arguments"].get("city", ""))]
        uses = all(v in run.answer for v in values)
    row.update(structured_call=first is not None, right_function=right_fn, right_arguments=right_args,
               answer_uses_result=uses)
    return row


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a pass rate."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def summarize(rows: pd.DataFrame) -> dict[str, Any]:
    """Rates over tool cases (catalog cities), plain-answer rate over no-tool cases."""
    tool_rows = rows[rows["kind"] != "chat"]
    chat_rows = rows[rows["kind"] == "chat"]
    out: dict[str, Any] = {"tool_cases": len(tool_rows), "chat_cases": len(chat_rows)}
    for col in ("structured_call", "right_function", "right_arguments"):
        out[col] = round(float(tool_rows[col].mean()), 3) if len(tool_rows) else None
    used = tool_rows["answer_uses_result"].dropna()
    out["answer_uses_result"] = round(float(used.mean()), 3) if len(used) else None
    out["answer_cases"] = int(len(used))
    out["plain_answer_when_no_tool_fits"] = round(float(chat_rows["right_function"].mean()), 3) if len(chat_rows) else None
    per_kind = rows.groupby("kind")[["right_function", "right_arguments"]].mean().round(3)
    out["per_kind"] = per_kind.to_dict(orient="index")
    if "ended_in_reasoning" in rows:
        out["ended_in_reasoning"] = round(float(rows["ended_in_reasoning"].mean()), 3)
        out["mean_reasoning_tokens"] = round(float(rows["reasoning_tokens"].mean()), 1)
    return out


def evaluate(lab: Lab, n_per_kind: int = 20, novel: bool = True,
             thinking: bool = False) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Run the held-out set (and the unseen-city set), thinking on or off; returns per-case rows and a summary."""
    rows = pd.DataFrame([run_case(lab, ex, thinking) for ex in corpus.heldout_cases(n_per_kind)])
    summary = {"thinking": thinking, **summarize(rows)}
    if novel:
        novel_rows = pd.DataFrame([run_case(lab, ex, thinking) for ex in corpus.novel_name_cases()])
        novel_rows["kind"] = "novel_city"
        summary["novel_city_right_function"] = round(float(novel_rows["right_function"].mean()), 3)
        summary["novel_city_right_arguments"] = round(float(novel_rows["right_arguments"].mean()), 3)
        rows = pd.concat([rows, novel_rows], ignore_index=True)
    return rows, summary
