"""Every request the helpers send, and what each says about thinking.

The workshop model (Qwen3) thinks unless a request sends ``chat_template_kwargs: {"enable_thinking": false}``. Each
request path below goes through a recording client (no engine), and the table at the end of the file is what they
must send: ``False`` (thinking off, said in the request), ``True`` (thinking asked for and budgeted), never nothing
for a path that one of the lessons relies on. The agent loop's reasoning hook is checked on scripted replies: the
reasoning kept apart from the content, reasoning tokens apart from answer tokens, a turn cut off while thinking
reported as such.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from helpers.evals import agent, structured, suite, toolcall
from helpers.measure import workloads
from helpers.tiny import corpus


def _usage(prompt=50, completion=10, reasoning=None):
    details = SimpleNamespace(reasoning_tokens=reasoning) if reasoning is not None else None
    return SimpleNamespace(prompt_tokens=prompt, completion_tokens=completion, completion_tokens_details=details)


def _reply(content="It is 5.", reasoning=None, calls=None, finish="stop", reasoning_tokens=None, completion=10):
    message = SimpleNamespace(content=content, reasoning=reasoning, tool_calls=calls)
    return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason=finish)],
                           usage=_usage(completion=completion, reasoning=reasoning_tokens))


class _Call(SimpleNamespace):
    def model_dump(self, include=None):
        return {"id": self.id, "type": "function", "function": {"name": self.function.name,
                                                                "arguments": self.function.arguments}}


def _weather_call(city="Paris"):
    return _Call(id="c1", function=SimpleNamespace(name="get_weather", arguments=json.dumps({"city": city})))


class RecordingLab:
    """A Lab whose ``chat`` and ``client.chat.completions.create`` record each request and answer from a script."""

    model = "recorded"

    def __init__(self, *replies):
        self.replies, self.requests = list(replies), []
        self.client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=self._create)))

    def _next(self):
        return self.replies.pop(0) if self.replies else _reply()

    def chat(self, messages, **kwargs):
        self.requests.append(kwargs)
        return self._next()

    def _create(self, **kwargs):
        self.requests.append(kwargs)
        if kwargs.get("stream"):
            delta = SimpleNamespace(content='{"name": "get_weather"}', reasoning=None, tool_calls=None)
            return iter([SimpleNamespace(choices=[SimpleNamespace(delta=delta, finish_reason="stop")],
                                         usage=_usage())])
        return self._next()


def thinking_sent(request: dict) -> bool | None:
    """What a chat request says about thinking: True, False, or None (nothing: the template's default)."""
    body = request.get("extra_body") or {}
    kwargs = body.get("chat_template_kwargs", request.get("chat_template_kwargs"))
    return None if kwargs is None else kwargs.get("enable_thinking")


def _agent_off(lab):
    agent.run_agent(lab, "What is 2+3?")


def _agent_on(lab):
    agent.run_agent(lab, "What is 2+3?", thinking=True)


def _tools_cost(lab):
    agent.prompt_tokens_with_tools(lab, "hi", agent.TOOLS)


def _eval_task(lab):
    loaded = suite.load_suite()
    suite.run_task(lab, loaded.tasks[0], loaded)


def _structured(lab):
    loaded, tasks = structured.json_tasks(limit=1)
    structured._answer(lab, tasks[0], loaded, structured.SCHEMA)


def _heldout(thinking):
    def run(lab):
        toolcall.run_case(lab, corpus.heldout_cases(n_per_kind=1)[0], thinking=thinking)
    return run


def _stream(thinking=None, **kwargs):
    def run(lab):
        from helpers.measure.stream_timing import stream_chat

        extra = {} if thinking is None else {"thinking": thinking}
        stream_chat(lab.client, lab.model, [{"role": "user", "content": "hi"}], max_tokens=8, **extra, **kwargs)
    return run


def _thinking_cost(thinking):
    def run(lab):
        from helpers.lessons.l04_thinking import ask

        ask(lab, "What is 2+3?", thinking, 64)
    return run


def _time_lengths(lab):
    from helpers.measure.stream_timing import time_lengths

    time_lengths(lab.client, lab.model, [{"role": "user", "content": "hi"}], [4], repeats=1, progress=False)


# request path -> what it must send for thinking, and the max_tokens it budgets (None: not checked here)
CHAT_PATHS = {
    "agent loop (run_agent), default": (_agent_off, False, agent.MAX_TOKENS),
    "agent loop (run_agent), thinking=True": (_agent_on, True, agent.THINKING_MAX_TOKENS),
    "tools' prompt cost (prompt_tokens_with_tools)": (_tools_cost, False, 1),
    "eval suite task (suite.run_task)": (_eval_task, False, suite.DEFAULT_MAX_TOKENS),
    "structured output (structured._answer, notebook 08)": (_structured, False, suite.DEFAULT_MAX_TOKENS),
    "held-out tool calls (toolcall.run_case), thinking off": (_heldout(False), False, agent.MAX_TOKENS),
    "held-out tool calls (toolcall.run_case), thinking on": (_heldout(True), True, agent.THINKING_MAX_TOKENS),
    "timed stream (stream_chat, notebooks 01, 03, 05, 08), default": (_stream(), False, 8),
    "timed stream (stream_chat), thinking=True": (_stream(True), True, 8),
    "timed stream (stream_chat) with its own extra_body": (_stream(extra_body={"ignore_eos": True}), False, 8),
    "streams by length (time_lengths, notebook 03)": (_time_lengths, False, 4),
    "thinking's cost (l04_thinking.ask, notebook 04), off": (_thinking_cost(False), False, 64),
    "thinking's cost (l04_thinking.ask, notebook 04), on": (_thinking_cost(True), True, 64),
}


@pytest.mark.parametrize("path", list(CHAT_PATHS))
def test_every_chat_request_of_a_path_says_what_it_does_about_thinking(path):
    run, expected, max_tokens = CHAT_PATHS[path]
    lab = RecordingLab()
    run(lab)
    assert lab.requests, f"{path} sent no request"
    for request in lab.requests:
        assert thinking_sent(request) is expected, f"{path} sent enable_thinking={thinking_sent(request)}"
        if max_tokens is not None:
            assert request["max_tokens"] == max_tokens, f"{path} budgets {request['max_tokens']} tokens a turn"


def _workload_default():
    return workloads.Workload()


def _workload_scorecard(monkeypatch):
    """The load sweep of a scorecard row (notebooks 05, 06, 08): the Workload measure_config builds."""
    from helpers.evals import scorecard
    from helpers.measure import loadgen

    seen = []

    def fake_sweep(settings, workload, **kwargs):
        seen.append(workload)
        raise RuntimeError("recorded")

    monkeypatch.setattr(loadgen, "run_sweep", fake_sweep)
    lab = SimpleNamespace(model="m", settings=SimpleNamespace(), engine=None)
    with pytest.raises(RuntimeError, match="recorded"):
        scorecard.measure_config(lab, "baseline", suite=None)
    return seen[0]


def _workload_speculative():
    """Notebook 06's agent traffic (its tools, answered as the model would)."""
    from helpers.lessons.l06.runs import agent_workload

    return agent_workload()


@pytest.mark.parametrize("name", ["Workload() (notebooks 03, 04, 07, the bench command)", "scorecard load sweep",
                                  "speculative agent traffic (l06)"])
def test_every_load_workload_turns_thinking_off_unless_it_asks(name, monkeypatch):
    workload = {"Workload() (notebooks 03, 04, 07, the bench command)": _workload_default,
                "scorecard load sweep": lambda: _workload_scorecard(monkeypatch),
                "speculative agent traffic (l06)": _workload_speculative}[name]()
    body = workload.request_body("m", [{"role": "user", "content": "x"}], 8)
    assert thinking_sent(body) is False
    # the calibration of prompt lengths asks /tokenize with the same template kwargs (loadgen.calibrate_for)
    assert workload.extra_body["chat_template_kwargs"] == {"enable_thinking": False}


def test_a_workload_that_asks_for_thinking_sends_nothing_and_its_own_kwargs_win():
    assert thinking_sent(workloads.Workload(thinking=True).request_body("m", [], 8)) is None
    own = workloads.Workload(extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert thinking_sent(own.request_body("m", [], 8)) is True


# ---------------------------------------------------------------- the agent's reasoning hook

def test_the_agent_keeps_reasoning_apart_from_content_and_counts_its_tokens():
    lab = RecordingLab(_reply(content="\n\n", reasoning="The user asks for the weather.", calls=[_weather_call()],
                              reasoning_tokens=7, completion=30),
                       _reply(content="It is 18 C in Paris.", reasoning="The tool has answered.", reasoning_tokens=5,
                              completion=14))
    run = agent.run_agent(lab, "What's the weather in Paris?", thinking=True)
    assert run.stopped == agent.ANSWERED and run.called_tools and run.answer == "It is 18 C in Paris."
    trace = run.trace()
    assert trace["reasoning"].tolist() == ["The user asks for the weather.", "The tool has answered."]
    assert trace["reasoning_tokens"].tolist() == [7, 5] and trace["answer_tokens"].tolist() == [23, 9]
    sent_back = lab.requests and run.messages[1]
    assert "reasoning" not in sent_back and sent_back["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_turn_cut_off_inside_the_reasoning_is_reported_as_such():
    lab = RecordingLab(_reply(content=None, reasoning="The user asks for the weath", finish="length",
                              reasoning_tokens=8, completion=8))
    run = agent.run_agent(lab, "What's the weather in Paris?", thinking=True, max_tokens=8)
    assert run.stopped == agent.CUT_IN_REASONING and run.ended_in_reasoning and run.answer is None
    assert not run.called_tools and "inside the reasoning" in run.trace()["action"][0]


def test_a_plain_answer_cut_off_by_max_tokens_is_not_called_reasoning():
    run = agent.run_agent(RecordingLab(_reply(content="It is", finish="length")), "hi", max_tokens=2)
    assert run.stopped == agent.CUT_OFF and not run.ended_in_reasoning


def test_heldout_both_modes_writes_one_summary_per_mode_and_the_rows_of_both(monkeypatch, tmp_path):
    import pandas as pd

    from helpers.cli import main as cli

    asked = []

    def fake_evaluate(lab, n_per_kind, thinking):
        asked.append(thinking)
        return pd.DataFrame([{"kind": "weather", "right_function": thinking}]), {"thinking": thinking}

    monkeypatch.setattr(cli, "connect", lambda *a, **k: object())
    monkeypatch.setattr(toolcall, "evaluate", fake_evaluate)
    summary, rows = tmp_path / "heldout.json", tmp_path / "rows.csv"
    assert cli.main(["heldout", "--thinking", "both", "--n", "1", "--json", str(summary), "--csv", str(rows)]) == 0
    assert asked == [False, True]
    written = json.loads(summary.read_text())
    assert written == {"thinking_off": {"thinking": False}, "thinking_on": {"thinking": True}}
    assert pd.read_csv(rows)["thinking"].tolist() == [False, True]


def test_a_body_that_names_its_own_template_kwargs_keeps_them():
    from helpers.core.thinking import with_thinking

    own = {"chat_template_kwargs": {"enable_thinking": True, "x": 1}, "ignore_eos": True}
    assert with_thinking(own, False) == own
    assert with_thinking(None, False) == {"chat_template_kwargs": {"enable_thinking": False}}
    assert with_thinking({"ignore_eos": True}, True) == {"chat_template_kwargs": {"enable_thinking": True},
                                                         "ignore_eos": True}
