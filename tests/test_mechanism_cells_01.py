"""Notebook 01's mechanism cells against the helpers that take over from them, on scripted inputs (no engine).

Each cell tagged ``mechanism`` is run from the notebook's own source in a fresh namespace, with the few names it
reads (``lab``, ``STREAM_MAX_TOKENS``, ``QUESTIONS``), against a fake client; the helper runs on the same script and
the two must agree:

- the streaming timer and ``stream_chat``: the same TTFT and TPOT on one clock, for a steady stream and for a stream
  of one chunk (TPOT undefined in both); a chunk of several tokens is where they part, and why the helper counts the
  server's tokens;
- the bare agent loop and ``run_agent``: the same requests, the same tool results sent back and the same answer, for a
  reply with a tool call and for a reply with none.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fakes import RecordingEngine, ToolCall, reply
import notebook_cells
from helpers.core.vllm_args import EngineConfig
from helpers.engine.session import Lab
from helpers.evals.agent import run_agent
from helpers.measure.stream_timing import stream_chat

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "01_connect_and_first_agent.ipynb"
MODEL = "tiny-agent"


def mechanism_cells() -> list[str]:
    cells = [c.source for c in notebook_cells.tagged_cells(NOTEBOOK, "mechanism")]
    assert len(cells) == 2, "notebook 01 writes out two mechanisms: the streaming timer and the agent loop"
    return cells


def cell(start: str) -> str:
    [source] = [c for c in mechanism_cells() if start in c]
    assert 10 <= len(source.splitlines()) <= 25, "a mechanism cell is 10 to 25 lines"
    return source


def run_cell(source: str, **names) -> dict:
    return notebook_cells.run_cells(source, **names)


def test_the_mechanism_cells_import_no_helper_that_does_their_work():
    for source in mechanism_cells():
        assert "stream_chat" not in source and "run_agent" not in source and "helpers.measure" not in source
        assert "helpers.evals" not in source


# ---------------------------------------------------------------- the streaming timer

class Clock:
    """time.perf_counter for both timers: the fake stream moves it to each chunk's arrival."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _chunk(text: str | None, tokens_so_far: int | None, choices: bool = True):
    delta = SimpleNamespace(content=text, reasoning=None, tool_calls=None)
    usage = None if tokens_so_far is None else SimpleNamespace(completion_tokens=tokens_so_far, prompt_tokens=12)
    return SimpleNamespace(choices=[SimpleNamespace(delta=delta, finish_reason=None)] if choices else [], usage=usage)


class StreamingClient:
    """A client whose stream yields scripted chunks ``(arrival s, text, tokens so far)`` as vLLM sends them: a role
    chunk first (no text, no token), then the text chunks, then the usage-only chunk."""

    def __init__(self, clock: Clock, events: list[tuple[float, str, int]]) -> None:
        self.clock, self.events, self.requests = clock, events, []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **kwargs):
        self.requests.append(kwargs)
        sent = self.clock.now

        def stream():
            self.clock.now = sent + 0.001
            yield _chunk("", 0)
            for at, text, tokens in self.events:
                self.clock.now = sent + at
                yield _chunk(text, tokens)
            yield _chunk(None, self.events[-1][2], choices=False)
        return stream()


def both_timers(monkeypatch, events):
    """(TTFT, TPOT) from the notebook's cell and from stream_chat on the same scripted stream and clock."""
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    client = StreamingClient(clock, events)
    mine = run_cell(cell("def time_stream"), lab=SimpleNamespace(client=client, model=MODEL), STREAM_MAX_TOKENS=32)
    clock.now = 100.0
    helper = stream_chat(client, MODEL, [{"role": "user", "content": "tell me a joke"}], max_tokens=32,
                         extra_body={"ignore_eos": True})
    return mine, helper, client


def test_the_timer_gives_the_helpers_ttft_and_tpot_on_a_steady_stream(monkeypatch, capsys):
    events = [(0.050 + 0.010 * i + 0.001 * (i % 3), f"w{i} ", i + 1) for i in range(12)]
    mine, helper, client = both_timers(monkeypatch, events)
    assert mine["ttft_s"] == pytest.approx(helper.ttft_s) == pytest.approx(0.050)
    assert mine["tpot_s"] == pytest.approx(helper.tpot_s) == pytest.approx((events[-1][0] - 0.050) / 11)
    assert len(mine["arrivals"]) == helper.completion_tokens == 12
    assert "12 chunks with text: TTFT 50.0 ms" in capsys.readouterr().out
    # the same request: the cell sends what the helper sends, bar the helper's usage counting
    cell_request, helper_request = client.requests
    assert {k: v for k, v in helper_request.items() if k != "stream_options"} == cell_request


def test_a_stream_of_one_chunk_has_a_ttft_and_no_tpot_in_both(monkeypatch, capsys):
    mine, helper, _ = both_timers(monkeypatch, [(0.080, "Hi", 1)])
    assert mine["ttft_s"] == pytest.approx(helper.ttft_s) == pytest.approx(0.080)
    assert mine["tpot_s"] is None and helper.tpot_s is None
    assert "TPOT undefined (one chunk)" in capsys.readouterr().out


def test_a_chunk_of_several_tokens_is_where_the_cell_and_the_helper_part(monkeypatch):
    # 1 token, then a chunk of 3 (a speculative step), then 1: 5 tokens in 3 chunks
    mine, helper, _ = both_timers(monkeypatch, [(0.05, "a", 1), (0.09, "bcd", 4), (0.13, "e", 5)])
    assert mine["tpot_s"] == pytest.approx(0.04)  # 0.08 s over 2 gaps between chunks
    assert helper.tpot_s == pytest.approx(0.02)  # 0.08 s over the 4 tokens after the first, the server's count


# ---------------------------------------------------------------- the agent loop

class RecordingClient:
    """A client that answers each chat call with the next scripted reply and keeps each request as it was sent."""

    def __init__(self, *replies) -> None:
        self.replies, self.requests = list(replies), []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **kwargs):
        self.requests.append(copy.deepcopy(kwargs))
        return self.replies.pop(0)


def both_agents(question: str, script: list):
    """The notebook's loop and run_agent on the same scripted replies: (cell namespace, run, cell's and helper's
    requests)."""
    mine_client, helper_client = RecordingClient(*copy.deepcopy(script)), RecordingClient(*copy.deepcopy(script))
    mine = run_cell(cell("def agent"), lab=SimpleNamespace(client=mine_client, model=MODEL), QUESTIONS=[question])
    lab = Lab(SimpleNamespace(), RecordingEngine(EngineConfig(MODEL, MODEL)), helper_client)
    return mine, run_agent(lab, question), mine_client.requests, helper_client.requests


def weather_call(city: str) -> ToolCall:
    return ToolCall(id="call-1", function=SimpleNamespace(name="get_weather", arguments=json.dumps({"city": city})))


def test_the_loop_sends_what_run_agent_sends_and_ends_on_the_same_answer(capsys):
    mine, run, sent, helper_sent = both_agents("What's the weather in Paris?",
                                               [reply(calls=[weather_call("Paris")]), reply("Paris: 18 C, cloudy.")])
    assert mine["answer"] == run.answer == "Paris: 18 C, cloudy."
    assert len(sent) == len(helper_sent) == 2
    assert sent == helper_sent  # every request, the second with the tool call and its result appended
    tool_message = sent[1]["messages"][-1]
    assert tool_message["role"] == "tool" and json.loads(tool_message["content"]) == run.steps[0].tool_calls[0]["result"]
    assert "tool results sent back: ['{" in capsys.readouterr().out


def test_a_reply_with_no_tool_call_is_the_answer_in_both(capsys):
    mine, run, sent, helper_sent = both_agents("Hello", [reply("Hello! Ask me about the weather.")])
    assert mine["answer"] == run.answer == "Hello! Ask me about the weather."
    assert sent == helper_sent and len(sent) == 1
    assert mine["messages"] == [{"role": "user", "content": "Hello"}]
    assert "tool results sent back: []" in capsys.readouterr().out
