"""The tiny models' chat format: a ChatML-style template with hermes-style tool calls.

The same format is written twice on purpose, and a unit test holds them equal: ``CHAT_TEMPLATE``
is the Jinja template shipped in the tokenizer (what vLLM renders), and ``render_segments`` is the
Python twin the training script uses to know which characters the assistant wrote (the loss is
taken on those only).

The tools block is one line (``tools: get_weather(city) | ...``) rather than the full JSON schemas,
so prompts stay short enough for a tiny model.
"""

from __future__ import annotations

import json
from typing import Any

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_START, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"

# Newlines are written as {{ '\n' }}: transformers renders with trim_blocks, which would eat a
# literal newline after a block tag, and the training renderer below must match byte for byte.
NL = "{{ '\\n' }}"
CHAT_TEMPLATE = (
    "{% set ns = namespace(first=0, system='') %}"
    "{% if messages and messages[0].role == 'system' %}"
    "{% set ns.system = messages[0].content %}{% set ns.first = 1 %}"
    "{% endif %}"
    "{% if tools or ns.system %}<|im_start|>system"
    "{% if ns.system %}" + NL + "{{ ns.system }}{% endif %}"
    "{% if tools %}" + NL + "tools:"
    "{% for t in tools %}{% set f = t.function if t.function is defined else t %}"
    "{{ ' | ' if not loop.first else ' ' }}{{ f.name }}({{ (f.parameters.properties or {}) | join(', ') }})"
    "{% endfor %}{% endif %}<|im_end|>" + NL + "{% endif %}"
    "{% for m in messages[ns.first:] %}"
    "{% if m.role == 'user' %}<|im_start|>user" + NL + "{{ m.content }}<|im_end|>" + NL +
    "{% elif m.role == 'assistant' %}<|im_start|>assistant" + NL + "{{ m.content or '' }}"
    "{% for tc in (m.tool_calls or []) %}{% set f = tc.function if tc.function is defined else tc %}"
    "<tool_call>" + NL + "{\"name\": \"{{ f.name }}\", \"arguments\": "
    "{{ f.arguments if f.arguments is string else (f.arguments | tojson) }}}" + NL + "</tool_call>"
    "{% endfor %}<|im_end|>" + NL +
    "{% elif m.role == 'tool' %}<|im_start|>user" + NL + "<tool_response>" + NL + "{{ m.content }}" + NL +
    "</tool_response><|im_end|>" + NL +
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant" + NL + "{% endif %}"
)


def tools_line(tools: list[dict[str, Any]]) -> str:
    """The one-line tools block, e.g. ``tools: get_weather(city) | calculator(expression)``."""
    parts = []
    for tool in tools:
        fn = tool.get("function", tool)
        parts.append(f"{fn['name']}({', '.join(fn.get('parameters', {}).get('properties', {}) or {})})")
    return "tools: " + " | ".join(parts)


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """One hermes-style tool call as the model writes it."""
    return f'{TOOL_CALL_START}\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n{TOOL_CALL_END}'


def render_segments(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[tuple[str, bool]]:
    """The conversation as (text, written_by_assistant) pieces, in the template's exact format."""
    segments: list[tuple[str, bool]] = []
    first, system = 0, ""
    if messages and messages[0]["role"] == "system":
        system, first = messages[0]["content"], 1
    if tools or system:
        head = f"{IM_START}system"
        if system:
            head += f"\n{system}"
        if tools:
            head += "\n" + tools_line(tools)
        segments.append((head + f"{IM_END}\n", False))
    for m in messages[first:]:
        if m["role"] == "user":
            segments.append((f"{IM_START}user\n{m['content']}{IM_END}\n", False))
        elif m["role"] == "assistant":
            body = (m.get("content") or "") + "".join(
                tool_call_text(tc["function"]["name"], _arguments_dict(tc["function"]["arguments"]))
                for tc in m.get("tool_calls") or []
            )
            segments.append((f"{IM_START}assistant\n", False))
            segments.append((body + IM_END, True))
            segments.append(("\n", False))
        elif m["role"] == "tool":
            segments.append((f"{IM_START}user\n{TOOL_RESPONSE_START}\n{m['content']}\n{TOOL_RESPONSE_END}{IM_END}\n", False))
    return segments


def _arguments_dict(arguments: str | dict[str, Any]) -> dict[str, Any]:
    return json.loads(arguments) if isinstance(arguments, str) else arguments
