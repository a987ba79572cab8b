"""Record the kit's agent (``evals/agent.run_agent``) as sessions a replay can send again as load.

``record_sessions(lab, questions)`` runs the agent once per question through :class:`RecordingLab`, a thin stand-in
for the ``Lab`` that times every model call (sent, answered) and, on request, holds each request that carries tool
results for ``tool_delay_s`` first: the kit's tools answer at once, so without it every recorded think time would
be near zero. Each run becomes one :class:`~helpers.measure.replay.Session`: per model call, the messages added since
the previous answer, the answer as the agent kept it, the server's token counts (from the run's steps), and the gap
between the previous answer and this request. ``content="lengths"`` keeps no text: each prompt is tokenized by the
engine's ``/tokenize`` (with the same tools and template arguments) and kept only as block ids
(``measure.replay.block_hash_ids``). The file format is ``measure/replay.py``'s.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import httpx

from helpers.core.errors import WorkshopError
from helpers.evals.agent import run_agent
from helpers.measure.replay import (CONTENT_MODES, DEFAULT_BLOCK_TOKENS, Recording, RecordingError, Session, Turn,
                                    block_hash_ids)

DEFAULT_QUESTIONS = ("What's the weather in Paris?", "What is 17 * 23?", "Convert 5 km to miles.")
Tokenize = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]], list[int]]


@dataclass
class Call:
    """One model call as the recorder saw it: how many messages it sent, what else, and when (perf_counter s)."""

    messages: list[dict[str, Any]]
    kwargs: dict[str, Any]
    t_sent: float
    t_done: float


class RecordingLab:
    """Passes ``chat`` on to ``lab`` and times it; a request whose last message is a tool result waits
    ``tool_delay_s`` first (a slow tool, as the engine sees it). Everything else is the lab's."""

    def __init__(self, lab: Any, tool_delay_s: float = 0.0) -> None:
        self.lab, self.tool_delay_s, self.calls = lab, tool_delay_s, []

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        if self.tool_delay_s > 0 and messages and messages[-1].get("role") == "tool":
            time.sleep(self.tool_delay_s)
        sent = copy.deepcopy(messages)
        t_sent = time.perf_counter()
        resp = self.lab.chat(messages, **kwargs)
        self.calls.append(Call(sent, dict(kwargs), t_sent, time.perf_counter()))
        return resp

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lab, name)


def session_from_run(session_id: str, run: Any, calls: list[Call]) -> Session:
    """One session from an ``AgentRun`` and the recorder's calls (one per step, in order)."""
    if len(calls) != len(run.steps):
        raise RecordingError(f"session {session_id!r}: {len(calls)} model calls timed but {len(run.steps)} steps in "
                             "the run; record it again")
    turns, end_before = [], 0
    for i, (call, step) in enumerate(zip(calls, run.steps)):
        n = len(call.messages)
        if json.dumps(run.messages[:n], sort_keys=True, default=str) != json.dumps(call.messages, sort_keys=True,
                                                                                   default=str):
            raise RecordingError(f"session {session_id!r} turn {i + 1}: the agent's history is not what it sent")
        output = copy.deepcopy(run.messages[n]) if len(run.messages) > n else None
        turns.append(Turn(turn=i + 1, prompt_tokens=int(step.prompt_tokens),
                          completion_tokens=int(step.completion_tokens),
                          think_time_s=0.0 if i == 0 else max(0.0, call.t_sent - calls[i - 1].t_done),
                          input=copy.deepcopy(run.messages[end_before:n]), output=output,
                          latency_s=round(call.t_done - call.t_sent, 6), tool_calls=len(step.tool_calls),
                          finish_reason=step.finish_reason))
        end_before = n + 1
    first = calls[0].kwargs if calls else {}
    return Session(session_id, turns, first.get("tools"), dict(first.get("extra_body") or {}))


def engine_tokenizer(lab: Any) -> Tokenize:
    """The engine's ``/tokenize`` for a chat request: the prompt's token ids, template and tools included."""
    url = lab.settings.root_url.rstrip("/") + "/tokenize"

    def tokenize(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 request: dict[str, Any]) -> list[int]:
        body: dict[str, Any] = {"model": lab.model, "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        if request.get("chat_template_kwargs"):
            body["chat_template_kwargs"] = request["chat_template_kwargs"]
        try:
            resp = httpx.post(url, json=body, headers=lab.settings.auth_headers(), timeout=30.0)
        except httpx.HTTPError as err:
            raise WorkshopError(f"cannot reach {url} ({type(err).__name__}) to record lengths only: is the "
                                "engine running? (`workshop status`)") from None
        if resp.status_code != 200:
            raise WorkshopError(f"{url} answered HTTP {resp.status_code}: the lengths-only recording needs the "
                                "engine's /tokenize; record with --content full instead")
        return list(resp.json()["tokens"])

    return tokenize


def without_content(recording: Recording, tokenize: Tokenize, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> Recording:
    """The recording with no text left: each turn's prompt as block ids (one numbering for all sessions)."""
    ids: dict[str, int] = {}
    sessions = []
    for s in recording.sessions:
        flat, ends = s.history()
        prompts = [tokenize(flat[:end], s.tools, s.request) for end in ends]
        hashed = block_hash_ids(prompts, block_tokens, ids)
        turns = [Turn(t.turn, t.prompt_tokens, t.completion_tokens, t.think_time_s, hash_ids=h, latency_s=t.latency_s,
                      tool_calls=t.tool_calls, finish_reason=t.finish_reason) for t, h in zip(s.turns, hashed)]
        sessions.append(Session(s.id, turns, request=s.request))  # template arguments are settings, not text
    return Recording("lengths", sessions, recording.model, recording.recorded_at, block_tokens, recording.source)


def record_sessions(lab: Any, questions: list[str] | tuple[str, ...] = DEFAULT_QUESTIONS, content: str = "full",
                    tool_delay_s: float = 0.0, block_tokens: int = DEFAULT_BLOCK_TOKENS,
                    tokenize: Tokenize | None = None, **agent_kwargs: Any) -> Recording:
    """Run the agent once per question and keep each run as a session (``content``: "full" or "lengths")."""
    if content not in CONTENT_MODES:
        raise ValueError(f"content must be one of {', '.join(CONTENT_MODES)} (got {content!r})")
    sessions = []
    for number, question in enumerate(questions):
        recorder = RecordingLab(lab, tool_delay_s)
        run = run_agent(recorder, question, **agent_kwargs)
        sessions.append(session_from_run(f"s{number}", run, recorder.calls))
    recording = Recording("full", sessions, str(getattr(lab, "model", "")),
                          datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                          source=f"helpers.evals.agent.run_agent, tool delay {tool_delay_s:g} s")
    if content == "lengths":
        recording = without_content(recording, tokenize or engine_tokenizer(lab), block_tokens)
    return recording
