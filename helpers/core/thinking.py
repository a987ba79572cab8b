"""Thinking, said in every request: the one field that turns a Qwen3 chat template's thinking on or off.

Qwen3's chat template (the workshop's Qwen/Qwen3-4B, and tiny-qwen3 on a CPU) thinks unless a request sends
``chat_template_kwargs: {"enable_thinking": false}``. vLLM hands those keyword arguments to the template, and a
template without a thinking mode (tiny-agent's) ignores them, so every helper can send the field to any model.
Measuring paths send thinking off, so a short turn's tokens are the answer's; a path that asks for thinking
budgets for the reasoning and shows it apart from the answer (``helpers.evals.agent.reasoning_of``).
"""

from __future__ import annotations

from typing import Any


def thinking_body(thinking: bool) -> dict[str, Any]:
    """The request field (in ``extra_body`` for the openai client) that turns thinking on or off."""
    return {"chat_template_kwargs": {"enable_thinking": bool(thinking)}}


def with_thinking(extra_body: dict[str, Any] | None, thinking: bool) -> dict[str, Any]:
    """``extra_body`` with the thinking field added, unless it already names its own ``chat_template_kwargs``."""
    body = dict(extra_body or {})
    if "chat_template_kwargs" not in body:
        body = {**thinking_body(thinking), **body}
    return body
