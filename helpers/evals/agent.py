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

from helpers.core.conclusion import NOT_SHOWN, SHOWN, Conclusion
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


def conclude_context_growth(prompt_tokens: list[int], completion_tokens: list[int],
                            min_growth: float = 1.5) -> Conclusion:
    """The context tax, judged: the prompt of the last call is at least ``min_growth`` x the first's while
    the answers stay shorter than the prompts (token counts as the server reported them)."""
    expectation = "the prompt grows with every call while the answers stay short"
    if len(prompt_tokens) < 2:
        return Conclusion(f"only {len(prompt_tokens)} model call was made: nothing to compare.", NOT_SHOWN, expectation)
    first, last = prompt_tokens[0], prompt_tokens[-1]
    growth = last / first if first else float("inf")
    mean_completion = sum(completion_tokens) / len(completion_tokens)
    text = (f"over {len(prompt_tokens)} calls the prompt went from {first:,} to {last:,} tokens ({growth:.1f}x); "
            f"the answers averaged {mean_completion:.0f} tokens")
    if growth >= min_growth and mean_completion < last:
        return Conclusion(text + ": agents pay for the whole context on every step.", SHOWN, expectation)
    return Conclusion(text + f": the prompt grew less than {min_growth:g}x (the conversation was short, or the "
                      "history was not re-sent).", NOT_SHOWN, expectation)


# ---------------------------------------------------------------- try it yourself: the tools' context tax

TOOL_TAX_CHOICES = ("fewer", "about the same", "more")


def prompt_tokens_with_tools(lab: Lab, question: str, tools: list[dict[str, Any]]) -> int:
    """The prompt tokens the server counts for ``question`` alone when ``tools`` are offered (none: no tools)."""
    resp = lab.chat([{"role": "user", "content": question}], max_tokens=1, **({"tools": tools} if tools else {}))
    return int(resp.usage.prompt_tokens)


def tool_tax_outcome(without_tools: int, with_tools: int, n_tools: int) -> tuple[str, str]:
    """How the prompt changed when the tools were offered (one of TOOL_TAX_CHOICES), with the numbers."""
    from helpers.core.lesson import ratio_outcome

    outcome = ratio_outcome(without_tools, with_tools, 0.05, TOOL_TAX_CHOICES)
    extra = with_tools - without_tools
    return outcome, (f"{without_tools:,} prompt tokens without tools, {with_tools:,} with {n_tools} tools: "
                     f"{extra:+,} tokens ({extra / max(1, n_tools):+,.0f} per tool), re-sent on every call of the agent.")
