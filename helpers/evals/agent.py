"""A minimal agent loop: call the model, run the tools it asks for, send results back, repeat.

Each model call is one step of the trace, with its latency and the prompt and completion tokens the
server counted, so a notebook can show how the prompt grows with every step (the "context tax").

Thinking is chosen on purpose. The workshop model (Qwen3) thinks unless a request sends
``chat_template_kwargs: {"enable_thinking": false}``; ``run_agent`` sends that by default (``thinking=False``:
the model calls the tool or answers at once). With ``thinking=True`` it asks the model to think and budgets for
it (``THINKING_MAX_TOKENS`` per turn instead of ``MAX_TOKENS``), and each step keeps the reasoning apart from
the content (vLLM's reasoning parser returns it in ``message.reasoning``) and the reasoning tokens apart from
the answer tokens (``usage.completion_tokens_details.reasoning_tokens``). A turn cut off by ``max_tokens``
before the reasoning ended is reported as such (``AgentRun.stopped == "ended inside the reasoning"``), not as
a turn without a tool call. Templates without the variable (the tiny agent's) ignore it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from helpers.core.thinking import thinking_body, with_thinking
from helpers.measure.tracing import NO_TRACE, NoTrace
from helpers.tiny.tools import TOOLS, call_tool

if TYPE_CHECKING:  # the lesson modules take a Lab; importing it at run time would pull in the engine
    from helpers.engine.session import Lab
    from helpers.measure.tracing import AgentTracer

MAX_TOKENS = 96  # a turn without thinking: one tool call or a short answer
THINKING_MAX_TOKENS = 1024  # a turn with thinking: the reasoning comes first (Qwen3-4B's often runs to hundreds)
ANSWERED, CUT_IN_REASONING, CUT_OFF, OUT_OF_STEPS = ("answered", "ended inside the reasoning",
                                                     "cut off by max_tokens", "ran out of steps")


def reasoning_of(message: Any, usage: Any) -> tuple[str | None, int | None]:
    """The hook: a reply's reasoning text (vLLM: ``reasoning``; older: ``reasoning_content``) and its token count."""
    text = getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None)
    details = getattr(usage, "completion_tokens_details", None)
    tokens = getattr(details, "reasoning_tokens", None) if details is not None else None
    return text or None, tokens


@dataclass
class AgentStep:
    """One model call and the tool calls it made."""

    step: int
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # name, arguments, result
    content: str | None = None
    reasoning: str | None = None
    reasoning_tokens: int | None = None  # as the server counted them (None: it did not say)
    finish_reason: str | None = None

    @property
    def ended_in_reasoning(self) -> bool:
        """Cut off by max_tokens while still thinking: no answer and no tool call yet, only reasoning."""
        return self.finish_reason == "length" and not self.tool_calls and not (self.content or "").strip() \
            and bool(self.reasoning)


@dataclass
class AgentRun:
    """A finished run: the final answer, every step, the whole conversation, and why it stopped."""

    question: str
    answer: str | None
    steps: list[AgentStep]
    messages: list[dict[str, Any]]
    stopped: str = ANSWERED

    def trace(self) -> pd.DataFrame:
        """One row per model call: latency, tokens (reasoning apart from answer), and what it did."""
        rows = []
        for s in self.steps:
            did = "; ".join(f"{c['name']}({json.dumps(c['arguments'], ensure_ascii=False)}) -> "
                            f"{json.dumps(c['result'], ensure_ascii=False)}" for c in s.tool_calls)
            if s.ended_in_reasoning:
                did = f"{CUT_IN_REASONING} (max_tokens)"
            answer_tokens = s.completion_tokens - (s.reasoning_tokens or 0)
            rows.append({"step": s.step, "latency_ms": round(s.latency_s * 1000, 1),
                         "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
                         "reasoning_tokens": s.reasoning_tokens, "answer_tokens": answer_tokens,
                         "reasoning": s.reasoning, "action": did or f"answer: {s.content}"})
        return pd.DataFrame(rows)

    @property
    def called_tools(self) -> bool:
        return any(s.tool_calls for s in self.steps)

    @property
    def ended_in_reasoning(self) -> bool:
        return self.stopped == CUT_IN_REASONING


def run_agent(lab: Lab, question: str, tools: list[dict[str, Any]] | None = None, max_steps: int = 4,
              history: list[dict[str, Any]] | None = None, thinking: bool = False,
              tracer: AgentTracer | NoTrace = NO_TRACE, **kwargs: Any) -> AgentRun:
    """Answer a question with tools; ``lab`` is a ``helpers.engine.session.Lab`` (or anything with ``chat``).

    ``thinking``: ask a thinking model to think first (budgeted at ``THINKING_MAX_TOKENS`` per turn) or not.
    ``tracer``: an ``helpers.measure.tracing.AgentTracer`` makes the run one trace (a span for the run, each model call
    and each tool call; each request carries its span's ``traceparent``); the default traces nothing."""
    tools = TOOLS if tools is None else tools
    messages = list(history or []) + [{"role": "user", "content": question}]
    steps: list[AgentStep] = []
    kwargs.setdefault("max_tokens", THINKING_MAX_TOKENS if thinking else MAX_TOKENS)
    kwargs["extra_body"] = with_thinking(kwargs.get("extra_body"), thinking)
    with tracer.run(question):
        for number in range(1, max_steps + 1):
            with tracer.llm_call(number, getattr(lab, "model", None), kwargs) as call:
                sent = call.request_kwargs(kwargs)
                start = time.perf_counter()
                resp = lab.chat(messages, tools=tools, **sent) if tools else lab.chat(messages, **sent)
                latency = time.perf_counter() - start
                call.finished(resp)
            choice = resp.choices[0]
            msg = choice.message
            reasoning, reasoning_tokens = reasoning_of(msg, resp.usage)
            step = AgentStep(number, latency, resp.usage.prompt_tokens, resp.usage.completion_tokens,
                             content=msg.content, reasoning=reasoning, reasoning_tokens=reasoning_tokens,
                             finish_reason=getattr(choice, "finish_reason", None))
            steps.append(step)
            if not msg.tool_calls:
                messages.append({"role": "assistant", "content": msg.content or ""})
                if step.ended_in_reasoning:
                    return AgentRun(question, None, steps, messages, CUT_IN_REASONING)
                return AgentRun(question, msg.content, steps, messages,
                                CUT_OFF if step.finish_reason == "length" else ANSWERED)
            messages.append({"role": "assistant", "content": msg.content,
                             "tool_calls": [tc.model_dump(include={"id", "type", "function"})
                                            for tc in msg.tool_calls]})
            for tc in msg.tool_calls:
                try:
                    arguments = json.loads(tc.function.arguments or "{}")
                except json.JSONDecodeError:
                    arguments = tc.function.arguments
                with tracer.tool_call(tc.function.name, tc.id):
                    result = call_tool(tc.function.name, arguments)
                step.tool_calls.append({"name": tc.function.name, "arguments": arguments, "result": result})
                messages.append({"role": "tool", "tool_call_id": tc.id,
                                 "content": json.dumps(result, ensure_ascii=False)})
        return AgentRun(question, None, steps, messages, OUT_OF_STEPS)


# ---------------------------------------------------------------- the tools' own cost: their schemas in the prompt

def prompt_tokens_with_tools(lab: Lab, question: str, tools: list[dict[str, Any]]) -> int:
    """The prompt tokens the server counts for ``question`` alone when ``tools`` are offered (none: no tools).

    Thinking off, as in ``run_agent``'s default: with it on, the template's prompt differs by its empty think block."""
    resp = lab.chat([{"role": "user", "content": question}], max_tokens=1, extra_body=thinking_body(False),
                    **({"tools": tools} if tools else {}))
    return int(resp.usage.prompt_tokens)
