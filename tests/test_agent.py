"""The agent loop against a scripted model: it runs the tool the model asks for, sends the result back and stops
at the answer, one trace row per model call (the loop against the real engine: test_engine_integration.py)."""

import json
from types import SimpleNamespace

from fakes import ToolCall, reply
from helpers.evals.agent import run_agent


class ScriptedLab:
    """Answers each chat call with the next reply of the script and keeps the messages it was sent."""

    def __init__(self, *replies):
        self.replies, self.sent = list(replies), []

    def chat(self, messages, **kwargs):
        self.sent.append([dict(m) for m in messages])
        return self.replies.pop(0)


def test_the_loop_runs_the_asked_tool_and_sends_its_result_back():
    call = ToolCall(id="call-1", function=SimpleNamespace(name="calculator", arguments=json.dumps({"expression": "2+3"})))
    lab = ScriptedLab(reply(calls=[call], prompt_tokens=120), reply("It is 5.", prompt_tokens=160))
    run = run_agent(lab, "What is 2+3?")
    assert run.answer == "It is 5." and run.called_tools and len(run.steps) == 2
    assert run.steps[0].tool_calls[0]["name"] == "calculator" and run.steps[0].tool_calls[0]["arguments"] == {"expression": "2+3"}
    tool_message = lab.sent[1][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call-1"
    assert json.loads(tool_message["content"]) == run.steps[0].tool_calls[0]["result"]
    assert run.trace()["prompt_tokens"].tolist() == [120, 160]


def test_the_loop_stops_after_max_steps_without_an_answer():
    call = ToolCall(id="c", function=SimpleNamespace(name="no_such_tool", arguments="{}"))
    run = run_agent(ScriptedLab(reply(calls=[call]), reply(calls=[call])), "loop forever", max_steps=2)
    assert run.answer is None and len(run.steps) == 2
    assert "unknown tool" in run.steps[0].tool_calls[0]["result"]["error"]
