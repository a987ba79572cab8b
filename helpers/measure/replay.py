"""An agent's recorded sessions as a file, and replayed as load: N copies of each session at once.

The file (JSON Lines, ``FORMAT`` version ``VERSION``): a header line, then one line per session.

- header: ``format``, ``version``, ``content`` (``"full"`` or ``"lengths"``), ``model``, ``recorded_at``,
  ``block_tokens`` (lengths only), ``source``.
- session: ``session`` (its id), ``turns`` (one per model call, in order), ``request`` (the other request fields
  it sent, e.g. ``chat_template_kwargs``); in full mode also ``tools`` (the schemas the agent offered).
- turn: ``turn`` (1, 2, ...), ``prompt_tokens`` and ``completion_tokens`` (as the server counted them),
  ``think_time_s`` (the gap between the previous answer's last byte and this request: tool time plus the agent's
  own; 0 on the first turn), ``latency_s``, ``tool_calls`` (how many the answer asked for), ``finish_reason``;
  in full mode ``input`` (the messages added since the previous answer: the question, tool results) and
  ``output`` (the answer, as the agent put it into its history); in lengths mode ``hash_ids`` instead.

Lengths mode keeps no text (for prompts a user may not share): each turn's prompt is cut into blocks of
``block_tokens`` tokens and each block is named by an id (the same id for the same block content after the same
prefix, across turns and sessions), as Mooncake's traces do (kvcache-ai/Mooncake, FAST'25 trace format:
``input_length``, ``output_length``, ``hash_ids``). The replay then writes one-token words for each id, so
the prefix shared in the recording is shared in the replay and nothing else is.

The replay (``replay``) takes a running engine's settings; it starts nothing. Each copy sends its session's turns in
order, each with the recorded history verbatim and the recorded output length forced (``max_tokens`` =
``min_tokens`` = the recorded count, ``ignore_eos``: vLLM's sampling parameters), after the recorded think time
(times ``think_scale``), with an ``X-Session-ID`` header (the header vLLM reads a session id from:
vllm/entrypoints/generate/base/serving.py, ``SESSION_ID_HEADER``). Each copy's first message that no other recorded
session shares is salted, so copies share no prefix the recording did not. A turn that fails ends its copy,
which is reported; the other copies go on. Timings are :class:`~helpers.measure.stream_timing.StreamTiming`, and the
run a :class:`~helpers.measure.loadgen.LoadResult`, so ``bench_results.summarize`` gives TTFT, TPOT and goodput.
"""

from __future__ import annotations

import asyncio
import copy as copying
import hashlib
import json
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from helpers.core.errors import WorkshopError
from helpers.core.settings import Settings
from helpers.measure import bench_results
from helpers.measure.loadgen import (LoadResult, RequestRecord, _http_client, _record_chunk, calibrate_for,
                                     run_sync)
from helpers.measure.stream_timing import STREAM_OPTIONS, StreamTiming
from helpers.measure.workloads import MARKER, Load, PromptFactory, Workload

FORMAT = "workshop-agent-sessions"
VERSION = 1
CONTENT_MODES = ("full", "lengths")
DEFAULT_BLOCK_TOKENS = 16  # vLLM's default KV block size on GPU (--block-size); Mooncake's traces use 512
SESSION_HEADER = "X-Session-ID"
HEADER_FIELDS = ("format", "version", "content", "model")
TURN_FIELDS = {"full": ("turn", "prompt_tokens", "completion_tokens", "think_time_s", "input", "output"),
               "lengths": ("turn", "prompt_tokens", "completion_tokens", "think_time_s", "hash_ids")}


class RecordingError(WorkshopError, ValueError):
    """A recording file that cannot be replayed; the message names the line and the field."""


# ---------------------------------------------------------------- the file

@dataclass
class Turn:
    """One model call of a recorded session."""

    turn: int
    prompt_tokens: int
    completion_tokens: int
    think_time_s: float  # previous answer done -> this request sent (0 on the first turn)
    input: list[dict[str, Any]] | None = None  # full mode: messages added since the previous answer
    output: dict[str, Any] | None = None  # full mode: the answer as the agent kept it
    hash_ids: list[int] | None = None  # lengths mode: one id per block of the prompt
    latency_s: float | None = None
    tool_calls: int = 0
    finish_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Session:
    """One agent run: its turns in order, and (full mode) the tools and request fields it sent."""

    id: str
    turns: list[Turn]
    tools: list[dict[str, Any]] | None = None
    request: dict[str, Any] = field(default_factory=dict)

    def history(self) -> tuple[list[dict[str, Any]], list[int]]:
        """Full mode: every message in order, and how many of them turn k's request sends (one count per turn)."""
        flat: list[dict[str, Any]] = []
        ends = []
        for t in self.turns:
            flat.extend(t.input or [])
            ends.append(len(flat))
            if t.output is not None:
                flat.append(t.output)
        return flat, ends

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"session": self.id}
        if self.tools is not None:
            out["tools"] = self.tools
        if self.request:
            out["request"] = self.request
        out["turns"] = [t.to_json() for t in self.turns]
        return out


@dataclass
class Recording:
    """A recording file's header and sessions."""

    content: str
    sessions: list[Session]
    model: str = ""
    recorded_at: str = ""
    block_tokens: int | None = None
    source: str = ""

    def header(self) -> dict[str, Any]:
        out = {"format": FORMAT, "version": VERSION, "content": self.content, "model": self.model,
               "recorded_at": self.recorded_at, "source": self.source}
        if self.block_tokens is not None:
            out["block_tokens"] = self.block_tokens
        return out

    def turns_frame(self) -> pd.DataFrame:
        """One row per recorded turn: session, turn, tokens, think time (s), tool calls."""
        return pd.DataFrame([{"session": s.id, "turn": t.turn, "prompt_tokens": t.prompt_tokens,
                              "completion_tokens": t.completion_tokens, "think_time_s": t.think_time_s,
                              "tool_calls": t.tool_calls} for s in self.sessions for t in s.turns])


def write_recording(recording: Recording, path: str | Path) -> Path:
    """Write the header and one line per session (JSON Lines); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [recording.header()] + [s.to_json() for s in recording.sessions]
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    return path


def _need(obj: Any, name: str, where: str, kinds: type | tuple[type, ...] = object) -> Any:
    """``obj[name]``, or RecordingError naming the field when it is missing or of another kind."""
    if not isinstance(obj, dict) or name not in obj:
        raise RecordingError(f"{where} has no {name!r} field: record the sessions again with `workshop record`")
    value = obj[name]
    if kinds is not object and (not isinstance(value, kinds) or isinstance(value, bool)):
        raise RecordingError(f"{where}: {name!r} is {value!r}, not what this kit writes there; "
                             "record the sessions again with `workshop record`")
    return value


def _turn(obj: Any, content: str, where: str) -> Turn:
    for name in TURN_FIELDS[content]:
        _need(obj, name, where)
    turn = Turn(turn=_need(obj, "turn", where, int), prompt_tokens=_need(obj, "prompt_tokens", where, int),
                completion_tokens=_need(obj, "completion_tokens", where, int),
                think_time_s=float(_need(obj, "think_time_s", where, (int, float))),
                latency_s=obj.get("latency_s"), tool_calls=int(obj.get("tool_calls") or 0),
                finish_reason=obj.get("finish_reason"))
    if turn.prompt_tokens < 1 or turn.completion_tokens < 0 or turn.think_time_s < 0:
        raise RecordingError(f"{where}: prompt_tokens must be >= 1, completion_tokens and think_time_s >= 0")
    if content == "full":
        turn.input = _need(obj, "input", where, list)
        turn.output = _need(obj, "output", where, (dict, type(None)))
    else:
        turn.hash_ids = _need(obj, "hash_ids", where, list)
        if not turn.hash_ids or not all(isinstance(h, int) for h in turn.hash_ids):
            raise RecordingError(f"{where}: 'hash_ids' must be a non-empty list of block ids (integers)")
    return turn


def read_recording(path: str | Path) -> Recording:
    """Read and check a recording; RecordingError names the line and field of anything this kit cannot replay."""
    path = Path(path)
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise RecordingError(f"cannot read {path} ({type(err).__name__}): give a file `workshop record` wrote") from None
    if not lines:
        raise RecordingError(f"{path} is empty: record some sessions first (`workshop record`)")
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise RecordingError(f"{path} line {number} is not JSON ({err.msg}): give a file `workshop record` "
                                 "wrote") from None
    header, where = rows[0], f"{path} line 1 (the header)"
    fmt = _need(header, "format", where, str)
    if fmt != FORMAT:
        raise RecordingError(f"{where}: format is {fmt!r}, not {FORMAT!r}: this is not a `workshop record` file")
    version = _need(header, "version", where, int)
    if version != VERSION:
        raise RecordingError(f"{where}: version is {version}, this kit reads version {VERSION}: record the "
                             "sessions again with this kit's `workshop record`")
    content = _need(header, "content", where, str)
    if content not in CONTENT_MODES:
        raise RecordingError(f"{where}: content is {content!r}; it must be one of {', '.join(CONTENT_MODES)}")
    block = header.get("block_tokens")
    if content == "lengths":
        block = _need(header, "block_tokens", where, int)
    sessions = []
    for number, obj in enumerate(rows[1:], 2):
        where = f"{path} line {number}"
        sid = str(_need(obj, "session", where, (str, int)))
        turns = _need(obj, "turns", f"{where} (session {sid!r})", list)
        if not turns:
            raise RecordingError(f"{where} (session {sid!r}) has no turns: record it again")
        parsed = [_turn(t, content, f"{where} (session {sid!r}, turn {i})") for i, t in enumerate(turns, 1)]
        if [t.turn for t in parsed] != list(range(1, len(parsed) + 1)):
            raise RecordingError(f"{where} (session {sid!r}): turns must be numbered 1, 2, ... in order")
        sessions.append(Session(sid, parsed, obj.get("tools"), dict(obj.get("request") or {})))
    if not sessions:
        raise RecordingError(f"{path} holds a header but no session: record some (`workshop record`)")
    return Recording(content, sessions, str(_need(header, "model", f"{path} line 1 (the header)", str)),
                     str(header.get("recorded_at", "")), block, str(header.get("source", "")))


def block_hash_ids(prompts: list[list[int]], block_tokens: int = DEFAULT_BLOCK_TOKENS,
                   ids: dict[str, int] | None = None) -> list[list[int]]:
    """Each prompt's token ids as block ids: a block's id names its tokens and every token before it (a chained
    hash, as vLLM's prefix cache names blocks), numbered 0, 1, ... in first-seen order across ``prompts`` (and
    ``ids``, the numbering so far, which it extends). The last block may be partial."""
    ids = {} if ids is None else ids
    out = []
    for tokens in prompts:
        chain, row = "", []
        for start in range(0, len(tokens), block_tokens):
            block = ",".join(map(str, tokens[start:start + block_tokens]))
            chain = hashlib.sha256(f"{chain}|{block}".encode()).hexdigest()
            row.append(ids.setdefault(chain, len(ids)))
        out.append(row)
    return out


# ---------------------------------------------------------------- salting: copies share what the recording shared

def private_message_index(recording: Recording) -> dict[str, int]:
    """Full mode, per session: the index (in its history) of its first message no other session has after the
    same history; the copies are salted there. A session with no such message gets its history's length."""
    histories = {s.id: s.history()[0] for s in recording.sessions}
    seen: dict[str, set[str]] = {}
    for sid, flat in histories.items():
        for i in range(len(flat)):
            seen.setdefault(json.dumps(flat[: i + 1], sort_keys=True), set()).add(sid)
    out = {}
    for sid, flat in histories.items():
        out[sid] = next((i for i in range(len(flat))
                         if len(seen[json.dumps(flat[: i + 1], sort_keys=True)]) == 1), len(flat))
    return out


def salt_text(run_salt: int, copy: int) -> str:
    """The fixed-width tag put in front of a copy's first private message."""
    return f"[replay {run_salt & 0xFFFFFF:06x}.{copy:03d}] "


def salted(message: dict[str, Any], tag: str) -> dict[str, Any]:
    """``message`` with ``tag`` in front of its text (a copy; the recording is left as it is)."""
    out = copying.deepcopy(message)
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [{"type": "text", "text": tag}] + content
    else:
        out["content"] = tag + (content or "")
    return out


def shared_block_ids(recording: Recording) -> set[int]:
    """Lengths mode: the block ids that more than one session's prompts hold (those stay shared by the copies)."""
    owners: dict[int, set[str]] = {}
    for s in recording.sessions:
        for t in s.turns:
            for h in t.hash_ids or []:
                owners.setdefault(h, set()).add(s.id)
    return {h for h, who in owners.items() if len(who) > 1}


def block_words(factory: PromptFactory, block_id: int, n: int, salt: str = "") -> list[str]:
    """``n`` one-token words that stand for one block (the same id and salt: the same words)."""
    rng = random.Random(f"{salt}/{block_id}")
    return [rng.choice(factory.words) for _ in range(n)]


def lengths_content(factory: PromptFactory, turn: Turn, block_tokens: int, shared: set[int], copy_salt: str) -> str:
    """A user message whose chat prompt is ``turn.prompt_tokens`` long, built block by block from its ids."""
    words: list[str] = []
    for h in turn.hash_ids or []:
        words.extend(block_words(factory, h, block_tokens, "" if h in shared else copy_salt))
    n = max(factory.id_digits, turn.prompt_tokens - factory.overhead_tokens)
    while len(words) < n:
        words.extend(block_words(factory, len(words), block_tokens, copy_salt + "/tail"))
    return MARKER + "".join(words[:n])


# ---------------------------------------------------------------- the schedule

@dataclass
class PlannedTurn:
    """What one copy sends at one turn: the body, and how long after the previous answer."""

    session: str
    copy: int
    turn: int
    think_s: float
    body: dict[str, Any]
    recorded: Turn


def plan_copy(recording: Recording, session: Session, copy: int, model: str, think_scale: float = 1.0,
              run_salt: int | None = None, factory: PromptFactory | None = None,
              private_index: dict[str, int] | None = None, shared: set[int] | None = None) -> list[PlannedTurn]:
    """The requests one copy of ``session`` sends, in order (``run_salt`` None: unsalted, the recording verbatim)."""
    planned = []
    if recording.content == "full":
        flat, ends = session.history()
        if run_salt is not None:
            at = (private_index or private_message_index(recording))[session.id]
            if at < len(flat):
                flat = flat[:at] + [salted(flat[at], salt_text(run_salt, copy))] + flat[at + 1:]
    elif factory is None:
        raise ValueError("a lengths-mode recording needs a calibrated PromptFactory to write its prompts")
    for t, end in zip(session.turns, ends if recording.content == "full" else [0] * len(session.turns)):
        n = max(1, t.completion_tokens)
        body: dict[str, Any] = {"model": model, "max_tokens": n, "min_tokens": n, "ignore_eos": True,
                                "stream": True, "stream_options": dict(STREAM_OPTIONS), "temperature": 0.0}
        body.update(session.request)
        if recording.content == "full":
            body["messages"] = copying.deepcopy(flat[:end])
            if session.tools:
                body["tools"] = session.tools
        else:
            tag = "" if run_salt is None else salt_text(run_salt, copy)
            body["messages"] = [{"role": "user", "content": lengths_content(
                factory, t, recording.block_tokens or DEFAULT_BLOCK_TOKENS,
                shared if shared is not None else shared_block_ids(recording), f"{session.id}{tag}")}]
        planned.append(PlannedTurn(session.id, copy, t.turn, 0.0 if t.turn == 1 else t.think_time_s * think_scale,
                                   body, t))
    return planned


# ---------------------------------------------------------------- the run

@dataclass
class ReplayResult:
    """A replay: the load run (every request's timing), which copy each request belongs to, and what failed."""

    load: LoadResult
    recording: Recording
    copies: int
    think_scale: float
    planned: dict[int, list[PlannedTurn]]  # conversation number -> that copy's turns
    failures: list[str] = field(default_factory=list)  # one sentence per copy that stopped

    def turns_frame(self) -> pd.DataFrame:
        """One row per request sent: session, copy, turn, tokens sent/recorded, think time and the gap, TTFT, TPOT."""
        rows, done_at = [], {}
        for r in sorted(self.load.requests, key=lambda r: (r.conversation, r.turn)):
            p = self.planned[r.conversation][r.turn - 1]
            t = r.timing
            prev = done_at.get(r.conversation)
            rows.append({"session": p.session, "copy": p.copy, "turn": r.turn, "ok": t.ok, "error": t.error,
                         "sent_s": t.t_sent - self.load.t_start,
                         "prompt_tokens": t.prompt_tokens, "recorded_prompt_tokens": p.recorded.prompt_tokens,
                         "completion_tokens": t.completion_tokens,
                         "recorded_completion_tokens": p.recorded.completion_tokens,
                         "think_time_s": p.think_s, "gap_s": None if prev is None else t.t_sent - prev,
                         "ttft_ms": None if t.ttft_s is None else t.ttft_s * 1000,
                         "tpot_ms": None if t.tpot_s is None else t.tpot_s * 1000})
            done_at[r.conversation] = t.t_done
        return pd.DataFrame(rows)

    def per_turn(self, slos: dict[str, float] | None = None) -> pd.DataFrame:
        """One row per turn number: requests, TTFT and TPOT (median, p99, ms), and the share within the SLOs."""
        slos_s = bench_results.parse_slos(slos)
        rows = []
        for turn in sorted({r.turn for r in self.load.requests}):
            recs = [r for r in self.load.requests if r.turn == turn]
            row = {"turn": turn, "requests": len(recs), "failed": sum(not r.timing.ok for r in recs),
                   "mean_prompt_tokens": sum(r.timing.prompt_tokens or 0 for r in recs) / len(recs)}
            for name in ("ttft", "tpot"):
                stats = bench_results.latency_stats(name, [getattr(r.timing, f"{name}_s") for r in recs], (99,))
                row[f"median_{name}_ms"], row[f"p99_{name}_ms"] = stats[f"median_{name}_ms"], stats[f"p99_{name}_ms"]
            if slos_s:
                row["within_slos"] = sum(bench_results.meets_slos(r, slos_s) for r in recs) / len(recs)
            rows.append(row)
        return pd.DataFrame(rows)

    def summary(self, slos: dict[str, float] | None = None, label: str | None = None) -> dict[str, Any]:
        """``bench_results.summarize`` of the run, plus the replay's own fields (sessions, copies, good sessions)."""
        out = bench_results.summarize(self.load, slos=slos, label=label)
        slos_s = bench_results.parse_slos(slos)
        by_copy: dict[int, list[RequestRecord]] = {}
        for r in self.load.requests:
            by_copy.setdefault(r.conversation, []).append(r)
        complete = [c for c, recs in by_copy.items() if len(recs) == len(self.planned[c]) and all(r.timing.ok
                                                                                                 for r in recs)]
        out.update({"mode": "replay", "replay_content": self.recording.content,
                    "replay_sessions": len(self.recording.sessions), "replay_copies": self.copies,
                    "replay_think_scale": self.think_scale, "replay_completed_sessions": len(complete),
                    "replay_failed_sessions": len(self.planned) - len(complete), "replay_failures": self.failures,
                    "replay_good_sessions": (sum(all(bench_results.meets_slos(r, slos_s) for r in by_copy[c])
                                                 for c in complete) if slos_s else None)})
        return out


async def _stream(http: Any, url: str, body: dict[str, Any], headers: dict[str, str], timing: StreamTiming) -> None:
    """Send one request and account its SSE chunks into ``timing`` (errors recorded, not raised)."""
    timing.t_sent = time.perf_counter()
    done = False
    try:
        async with http.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                timing.error = f"HTTP {resp.status}: {(await resp.read()).decode(errors='replace')[:300]}"
                return
            pending = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter()
                timing.t_first_byte = timing.t_first_byte or now
                *lines, pending = (pending + data).split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    text = line[5:].strip()
                    if text == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(text)
                    if "error" in chunk or chunk.get("object") == "error":
                        timing.error = f"server error in stream: {chunk.get('error', chunk)}"
                        return
                    _record_chunk(timing, chunk, now)
                if done:
                    break
        if not done:
            timing.error = "stream ended before [DONE]"
    except asyncio.CancelledError:
        raise
    except Exception as err:  # noqa: BLE001 - a failed request is a result (connection, timeout, bad JSON)
        timing.error = f"{type(err).__name__}: {err}"
    finally:
        timing.t_done = time.perf_counter()


async def areplay(settings: Settings, recording: Recording, copies: int = 1, *, think_scale: float = 1.0,
                  model: str | None = None, salt: bool = True, run_salt: int | None = None,
                  request_timeout_s: float = 300.0) -> ReplayResult:
    """Replay ``copies`` copies of every session at once against ``settings.base_url`` (coroutine)."""
    if copies < 1:
        raise ValueError(f"copies must be >= 1 (got {copies})")
    if not think_scale >= 0:
        raise ValueError(f"think_scale must be >= 0 (got {think_scale})")
    model = model or settings.model
    run_salt = (secrets.randbits(24) if run_salt is None else run_salt) if salt else None
    url = settings.base_url.rstrip("/") + "/chat/completions"
    index = private_message_index(recording) if recording.content == "full" else None
    shared = shared_block_ids(recording) if recording.content == "lengths" else None
    async with _http_client(None, request_timeout_s) as http:
        factory = None
        if recording.content == "lengths":  # one-token words, calibrated with the template arguments the turns send
            kwargs = recording.sessions[0].request.get("chat_template_kwargs")
            factory = await calibrate_for(settings, model, Workload(extra_body={"chat_template_kwargs": kwargs}
                                                                    if kwargs else {}), http)
        planned: dict[int, list[PlannedTurn]] = {}
        for s in recording.sessions:
            for c in range(copies):
                planned[len(planned)] = plan_copy(recording, s, c, model, think_scale, run_salt, factory, index,
                                                  shared)
        total = sum(len(p) for p in planned.values())
        result = LoadResult([], Load(concurrency=len(planned), num_requests=total), Workload(), model,
                            settings.base_url, prompt_len_method="recorded", salt=run_salt or 0)
        replay = ReplayResult(result, recording, copies, think_scale, planned)
        inflight = [0]

        async def one_copy(number: int, turns: list[PlannedTurn]) -> None:
            t_ready = result.t_start
            for p in turns:
                while time.perf_counter() < t_ready + p.think_s:  # the loop's clock may wake a little early
                    await asyncio.sleep(t_ready + p.think_s - time.perf_counter())
                headers = {**settings.auth_headers(), SESSION_HEADER: f"{p.session}-{p.copy}-{run_salt or 0:06x}"}
                timing = StreamTiming(t_sent=t_ready + p.think_s, t_scheduled=t_ready + p.think_s)
                result.requests.append(RequestRecord(len(result.requests), timing, p.recorded.prompt_tokens,
                                                     p.body["max_tokens"], number, p.turn))
                inflight[0] += 1
                result.max_inflight = max(result.max_inflight, inflight[0])
                try:
                    await _stream(http, url, p.body, headers, timing)
                finally:
                    inflight[0] -= 1
                if not timing.ok:
                    replay.failures.append(f"session {p.session!r} copy {p.copy} stopped at turn {p.turn} of "
                                           f"{len(turns)}: {timing.error or 'no token received'}")
                    return
                t_ready = timing.t_done or time.perf_counter()

        result.t_start = time.perf_counter()
        result.started_at = time.time()
        try:
            await asyncio.gather(*(one_copy(n, turns) for n, turns in planned.items()))
        except (asyncio.CancelledError, KeyboardInterrupt):
            result.interrupted, result.stop_reason = True, "interrupted (Ctrl-C or task cancelled)"
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        result.t_end = max((r.timing.t_done or r.timing.t_sent for r in result.requests), default=result.t_start)
    return replay


def replay(settings: Settings, recording: Recording | str | Path, copies: int = 1, **kwargs: Any) -> ReplayResult:
    """``areplay`` from synchronous code or a Jupyter cell; ``recording`` may be a path to read."""
    if not isinstance(recording, Recording):
        recording = read_recording(recording)
    return run_sync(lambda: areplay(settings, recording, copies, **kwargs))
