"""Per-request streaming timings, named as a careful benchmark names them.

- ``ttft_s``: send -> first token on any channel (content, reasoning or tool call).
- ``ttfot_s``: send -> first visible content token (later than TTFT when a model reasons first).
- ``tpot_s``: (t_last - t_first) / (n_out - 1), n_out from the server's usage.
- ``itl_chunk_s``: gaps between consecutive token-carrying chunks (vLLM's ``vllm bench serve`` ITL).
- ``itl_token_s``: the same gaps spread over the tokens each chunk carried (a chunk of k tokens
  contributes k samples of gap/k).
- ``client_queue_s``: scheduled -> sent, the time a request waited in the load generator itself
  (a concurrency cap, a busy event loop). Zero-cost to ignore for single requests (``t_scheduled`` unset).
Tokens per chunk come from the server (``stream_options.continuous_usage_stats``: a running
``completion_tokens`` in every chunk), never from re-tokenizing text.
The same definitions as vLLM's benchmark (``vllm bench serve``: vllm/benchmarks/serve.py, TTFT, TPOT
and ITL) and the vLLM documentation's metrics design page. A stall shows in ``itl_chunk_s`` as one
long gap; ``itl_token_s`` spreads it over the tokens that chunk carried, so a timeline uses the chunks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from helpers.core.thinking import with_thinking

STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


@dataclass
class StreamTiming:
    """Times (``time.perf_counter`` seconds) and token counts of one streamed request."""

    t_sent: float
    t_first_byte: float | None = None
    t_first_token: float | None = None
    t_first_content: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each token-carrying chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens that chunk carried
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    text: str = ""
    tool_call_text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    t_done: float | None = None
    t_scheduled: float | None = None  # when a load generator meant to send it (None: sent at once)
    usage: dict[str, Any] | None = None  # the server's last usage object (prompt/completion/total tokens)

    def record_chunk(self, t: float, completion_tokens: int | None, content: str = "", other: str = "") -> None:
        """Account one SSE chunk: ``completion_tokens`` is the server's running count."""
        if self.t_first_byte is None:
            self.t_first_byte = t
        new_tokens = 0 if completion_tokens is None else completion_tokens - self.completion_tokens
        if completion_tokens is None and (content or other):
            new_tokens = 1  # server without usage stats: one token per chunk is the best we know
        if new_tokens > 0:
            self.chunk_times.append(t)
            self.chunk_tokens.append(new_tokens)
            self.completion_tokens += new_tokens
            if self.t_first_token is None:
                self.t_first_token = t
        if content and self.t_first_content is None:
            self.t_first_content = t
        self.text += content
        self.tool_call_text += other

    @property
    def ok(self) -> bool:
        return self.error is None and self.t_first_token is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first_token is None else self.t_first_token - self.t_sent

    @property
    def ttfot_s(self) -> float | None:
        return None if self.t_first_content is None else self.t_first_content - self.t_sent

    @property
    def e2e_s(self) -> float | None:
        return None if self.t_done is None else self.t_done - self.t_sent

    @property
    def t_last_token(self) -> float | None:
        """Arrival of the last token-carrying chunk (perf_counter seconds)."""
        return self.chunk_times[-1] if self.chunk_times else None

    @property
    def client_queue_s(self) -> float:
        """Scheduled -> sent: time spent waiting inside the client (0 when never scheduled)."""
        return 0.0 if self.t_scheduled is None else self.t_sent - self.t_scheduled

    @property
    def e2e_incl_queue_s(self) -> float | None:
        """Scheduled -> done: what the user of an open-loop system actually waits."""
        return None if self.e2e_s is None else self.e2e_s + self.client_queue_s

    @property
    def tpot_s(self) -> float | None:
        if self.completion_tokens < 2 or not self.chunk_times:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.completion_tokens - 1)

    @property
    def itl_chunk_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    @property
    def itl_token_s(self) -> list[float]:
        out: list[float] = []
        for gap, k in zip(self.itl_chunk_s, self.chunk_tokens[1:]):
            out.extend([gap / k] * k)
        return out

    @property
    def median_gap_s(self) -> float | None:
        """Median gap between token-carrying chunks as they arrived (s); None with fewer than two chunks."""
        return median(self.itl_chunk_s) if self.itl_chunk_s else None

    @property
    def longest_gap_s(self) -> float | None:
        """Longest gap between token-carrying chunks as they arrived (s)."""
        return max(self.itl_chunk_s) if self.itl_chunk_s else None

    def chunk_gaps(self) -> list[tuple[int, float]]:
        """(number of the chunk's last token, gap before that chunk in s) for every chunk after the first."""
        ends, total = [], 0
        for k in self.chunk_tokens:
            total += k
            ends.append(total)
        return list(zip(ends[1:], self.itl_chunk_s))

    def token_times_s(self) -> list[float]:
        """Arrival time of every output token relative to send (tokens of one chunk share a time)."""
        return [t - self.t_sent for t, k in zip(self.chunk_times, self.chunk_tokens) for _ in range(k)]

    def summary(self) -> dict[str, Any]:
        """The headline figures in milliseconds, for a table."""
        ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
        return {"ttft_ms": ms(self.ttft_s), "ttfot_ms": ms(self.ttfot_s), "tpot_ms": ms(self.tpot_s),
                "e2e_ms": ms(self.e2e_s), "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "chunks": len(self.chunk_times),
                "error": self.error}


def stream_chat(client: Any, model: str, messages: list[dict[str, Any]], max_tokens: int = 128,
                on_chunk: Callable[[StreamTiming], None] | None = None, thinking: bool = False,
                **kwargs: Any) -> StreamTiming:
    """Stream one chat completion and time it; errors are recorded, not raised.

    ``on_chunk`` is called with the timing after every chunk (e.g. to know that a stream is decoding). ``thinking``
    False (the default) sends thinking off, so a Qwen3 model's tokens are its answer's (helpers.core.thinking);
    True leaves the template's default on, and the reasoning's chunks count as output that is not content."""
    kwargs.setdefault("temperature", 0.0)
    kwargs["extra_body"] = with_thinking(kwargs.get("extra_body"), thinking)
    timing = StreamTiming(t_sent=time.perf_counter())
    try:
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, stream=True,
                                                stream_options=STREAM_OPTIONS, **kwargs)
        for chunk in stream:
            now = time.perf_counter()
            usage = getattr(chunk, "usage", None)
            content, other = "", ""
            if chunk.choices:
                delta = chunk.choices[0].delta
                content = delta.content or ""
                reasoning = getattr(delta, "reasoning", None) or getattr(delta, "reasoning_content", None) or ""
                calls = "".join((tc.function.name or "") + (tc.function.arguments or "")
                                for tc in (delta.tool_calls or []) if tc.function)
                other = reasoning + calls
                timing.finish_reason = chunk.choices[0].finish_reason or timing.finish_reason
            timing.record_chunk(now, usage.completion_tokens if usage else None, content, other)
            if usage is not None:
                timing.prompt_tokens = usage.prompt_tokens
            if on_chunk is not None:
                on_chunk(timing)
    except Exception as err:  # noqa: BLE001 - a failed request is a result, kept with its error
        timing.error = f"{type(err).__name__}: {err}"
    timing.t_done = time.perf_counter()
    return timing


def time_lengths(client: Any, model: str, messages: list[dict[str, Any]], max_tokens: list[int], repeats: int = 2,
                 progress: bool | None = None) -> list[dict[str, Any]]:
    """Stream the same request at each ``max_tokens`` in turn (A/B/A/B, ``repeats`` rounds, ``ignore_eos``);
    one row per request: max_tokens, round, ttft_s, e2e_s, completion_tokens."""
    from helpers.core.progress import steps

    plan = [(r, n) for r in range(1, repeats + 1) for n in max_tokens]
    rows = []
    for round_, n in steps(plan, "streams", "request", progress, label=lambda p: f"max_tokens {p[1]}"):
        t = stream_chat(client, model, messages, max_tokens=n, extra_body={"ignore_eos": True})
        if not t.ok:
            raise RuntimeError(f"the streamed request failed: {t.error}. Check the engine (`workshop status`).")
        rows.append({"max_tokens": n, "round": round_, "ttft_s": t.ttft_s, "e2e_s": t.e2e_s,
                     "completion_tokens": t.completion_tokens})
    return rows
