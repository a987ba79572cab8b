"""A minimal agent loop: call the model, run the tools it asks for, send results back, repeat.

Each model call is one step of the trace, with its latency and the prompt and completion tokens the
server counted, so a notebook can show how the prompt grows with every step (the "context tax").
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from helpers.tiny.tools import TOOLS, call_tool

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab


@dataclass
class AgentStep:
    """One model call and the tool calls it made."""

    step: int
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # name, arguments, result
    content: str | None = None


@dataclass
class AgentRun:
    """A finished run: the final answer, every step, and the whole conversation."""

    question: str
    answer: str | None
    steps: list[AgentStep]
    messages: list[dict[str, Any]]

    def trace(self) -> pd.DataFrame:
        """One row per model call: latency, tokens, and what it did."""
        rows = []
        for s in self.steps:
            did = "; ".join(f"{c['name']}({json.dumps(c['arguments'], ensure_ascii=False)}) -> "
                            f"{json.dumps(c['result'], ensure_ascii=False)}" for c in s.tool_calls)
            rows.append({"step": s.step, "latency_ms": round(s.latency_s * 1000, 1),
                         "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
                         "action": did or f"answer: {s.content}"})
        return pd.DataFrame(rows)

    @property
    def called_tools(self) -> bool:
        return any(s.tool_calls for s in self.steps)


def run_agent(lab: Lab, question: str, tools: list[dict[str, Any]] | None = None, max_steps: int = 4,
              history: list[dict[str, Any]] | None = None, **kwargs: Any) -> AgentRun:
    """Answer a question with tools; ``lab`` is a ``helpers.engine.session.Lab`` (or anything with ``chat``)."""
    tools = TOOLS if tools is None else tools
    messages = list(history or []) + [{"role": "user", "content": question}]
    steps: list[AgentStep] = []
    kwargs.setdefault("max_tokens", 96)
    for number in range(1, max_steps + 1):
        start = time.perf_counter()
        resp = lab.chat(messages, tools=tools, **kwargs) if tools else lab.chat(messages, **kwargs)
        latency = time.perf_counter() - start
        msg = resp.choices[0].message
        step = AgentStep(number, latency, resp.usage.prompt_tokens, resp.usage.completion_tokens, content=msg.content)
        steps.append(step)
        if not msg.tool_calls:
            messages.append({"role": "assistant", "content": msg.content or ""})
            return AgentRun(question, msg.content, steps, messages)
        messages.append({"role": "assistant", "content": msg.content,
                         "tool_calls": [tc.model_dump(include={"id", "type", "function"}) for tc in msg.tool_calls]})
        for tc in msg.tool_calls:
            try:
                arguments = json.loads(tc.function.arguments or "{}")
            except json.JSONDecodeError:
                arguments = tc.function.arguments
            result = call_tool(tc.function.name, arguments)
            step.tool_calls.append({"name": tc.function.name, "arguments": arguments, "result": result})
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": json.dumps(result, ensure_ascii=False)})
    return AgentRun(question, None, steps, messages)


# ---------------------------------------------------------------- the tools' own cost: their schemas in the prompt

def prompt_tokens_with_tools(lab: Lab, question: str, tools: list[dict[str, Any]]) -> int:
    """The prompt tokens the server counts for ``question`` alone when ``tools`` are offered (none: no tools)."""
    resp = lab.chat([{"role": "user", "content": question}], max_tokens=1, **({"tools": tools} if tools else {}))
    return int(resp.usage.prompt_tokens)
