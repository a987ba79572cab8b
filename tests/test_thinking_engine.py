"""Against the real local engine serving tiny-qwen3 (Qwen3-4B's own template, ``--reasoning-parser qwen3``): the agent
with thinking on and off, and a turn cut off inside the reasoning. One engine start for the whole file, its own state
directory, stopped at the end (the suite's shared engine serves tiny-agent and is stopped before this file starts)."""

from __future__ import annotations

import os

import pytest

from fakes import engine_environment
from helpers.core.settings import TINY_QWEN3, load_settings
from helpers.evals.agent import CUT_IN_REASONING, run_agent

pytestmark = pytest.mark.engine
PORT = os.environ.get("WORKSHOP_TEST_PORT", "8765")
WEATHER_QUESTION = "What's the weather in Paris?"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from helpers.engine.session import connect

    with engine_environment(PORT, tmp_path_factory.mktemp("thinking-engine")):
        os.environ["MODEL_NAME"] = TINY_QWEN3
        lab = connect(load_settings())
        try:
            yield lab
        finally:
            lab.engine.stop()


def test_tiny_qwen3_is_served_with_the_reasoning_parser(lab):
    assert lab.check() == [TINY_QWEN3]
    args = lab.engine.config().args
    assert args[args.index("--reasoning-parser") + 1] == "qwen3" and "--enable-auto-tool-choice" in args


@pytest.mark.parametrize("thinking", [False, True], ids=["thinking-off", "thinking-on"])
def test_the_agent_calls_the_weather_tool_and_answers_from_its_result(lab, thinking):
    run = run_agent(lab, WEATHER_QUESTION, thinking=thinking)
    first = run.steps[0]
    assert first.tool_calls, f"no tool call (stopped: {run.stopped}; content {first.content!r}, reasoning " \
                             f"{first.reasoning!r})"
    call = first.tool_calls[0]
    # The city it passes is not checked: tiny-qwen3 learned the format, the tool and the modes, not yet to copy
    # every argument (models/README.md, its held-out rates). What it answers must come from the result it got.
    assert call["name"] == "get_weather" and set(call["arguments"]) == {"city"}
    result = call["result"]
    used = str(result["temperature_c"]) if "temperature_c" in result else str(result["city"])
    assert run.answer is not None and used in run.answer, run.trace().to_string()
    if thinking:  # the reasoning arrives apart from the content, its tokens counted by the server
        assert first.reasoning and "<think>" not in (first.content or "") and "</think>" not in (first.content or "")
        assert first.reasoning_tokens and 0 < first.reasoning_tokens < first.completion_tokens
    else:
        assert not first.reasoning and not first.reasoning_tokens


def test_a_turn_that_ends_inside_the_reasoning_is_reported_as_such(lab):
    run = run_agent(lab, WEATHER_QUESTION, thinking=True, max_tokens=4)
    step = run.steps[0]
    assert step.finish_reason == "length" and step.reasoning and not step.tool_calls
    assert run.stopped == CUT_IN_REASONING and run.ended_in_reasoning and run.answer is None
    assert run.trace()["action"][0].startswith(CUT_IN_REASONING)
