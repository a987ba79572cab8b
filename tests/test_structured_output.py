"""The structured-output A/B (helpers/evals/structured.py): requests, scoring by the eval's parser, the summary."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from helpers.evals import structured
from helpers.evals.structured import answer_row, json_tasks, round_medians, structured_request, summary


def test_the_two_requests_differ_only_by_the_schema():
    suite, tasks = json_tasks("agent-v1", 4)
    with_schema, free = (structured_request(tasks[0], suite, mode) for mode in ("json_schema", "free"))
    assert with_schema["response_format"]["type"] == "json_schema" and "response_format" not in free
    assert {k: v for k, v in with_schema.items() if k != "response_format"} == free
    with pytest.raises(ValueError):
        structured_request(tasks[0], suite, "grammar")
    plain = next(t for t in suite.tasks if t.category == "no_tool")
    with pytest.raises(ValueError, match="json tasks"):
        structured_request(plain, suite, "json_schema")


def test_the_tasks_are_spread_over_the_tools():
    _, tasks = json_tasks("agent-v1", 4)
    assert len(tasks) == 4 and len({t.kind for t in tasks}) == 4
    assert len(json_tasks("agent-v1")[1]) == 20


def test_an_answer_is_valid_only_when_the_evals_parser_accepts_it():
    _, tasks = json_tasks("agent-v1", 1)
    task = tasks[0]
    call = json.dumps(task.expect["call"])
    good = answer_row(task, "json_schema", call, 18, 0.003, 0.05, None)
    assert good["valid"] and good["right_values"] and good["tpot_ms"] == pytest.approx(3.0)
    tagged = answer_row(task, "free", f"<tool_call>\n{call}\n</tool_call>", 22, 0.003, 0.05, None)
    assert not tagged["valid"] and not tagged["parses"]
    failed = answer_row(task, "free", None, 0, None, None, "APIError: 400")
    assert not failed["valid"] and failed["tpot_ms"] is None


def test_the_ab_interleaves_rounds_and_summarizes_with_the_spread(monkeypatch):
    sent = []

    def fake_stream_chat(client, model, messages, **kwargs):
        mode = "json_schema" if "response_format" in kwargs else "free"
        sent.append(mode)
        task = next(t for t in json_tasks("agent-v1")[1] if t.messages == messages)
        text = json.dumps(task.expect["call"]) if mode == "json_schema" else "<tool_call>{}</tool_call>"
        return SimpleNamespace(text=text, completion_tokens=18, tpot_s=0.004 if mode == "json_schema" else 0.003,
                               ttft_s=0.05, error=None)

    monkeypatch.setattr(structured, "stream_chat", fake_stream_chat)
    lab = SimpleNamespace(client=None, model="tiny-agent")
    frame = structured.run_structured_ab(lab, num_tasks=2, rounds=2)
    assert sent == ["json_schema"] * 2 + ["free"] * 2 + ["json_schema"] * 2 + ["free"] * 2
    assert round_medians(frame) == {"json_schema": [4.0, 4.0], "free": [3.0, 3.0]}
    table = summary(frame)
    assert table.loc["json_schema", "valid"] == 1.0 and table.loc["free", "valid"] == 0.0
    assert table.loc["json_schema", "tpot_ms_min"] == 4.0 and table.loc["free", "answers"] == 4
