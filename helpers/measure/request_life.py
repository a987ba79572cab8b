"""One request's life as a picture (issue 27 part 4; the timeline of issue 28's traces is the same code).

The input is a ``RequestLife``: intervals in lanes (``Span``: lane, name, start and end in seconds from the
request's send) and, when a client streamed it, the arrival of each token-carrying chunk with its tokens. Two
builders fill it:

- ``from_stream(timing, served)``: the client's ``StreamTiming`` (``stream_chat``) and the server's metrics around
  that one request (``server_metrics.window(before, after)``, whose histogram means over one request are that
  request's own: ``vllm:request_queue_time_seconds``, ``..._prefill_time_seconds``, ``..._decode_time_seconds``,
  and ``vllm:time_to_first_token_seconds`` / ``vllm:e2e_request_latency_seconds`` from its arrival at the server).
  vLLM exposes durations, not timestamps, so they are placed on the client's clock: the server's arrival at the
  send (a local engine: no network to speak of), prefill ending at the server's own TTFT after it, the queue just
  before the prefill, the decode right after it, and the time before the queue (the chat template, tokenizing,
  handing it to the engine core) as ``arrival``. Nothing is fitted to the client's chunks, so ``alignment`` can
  check the two clocks against each other: the prefill should end just before the first chunk arrives.
- ``from_rows(rows)``: rows of ``lane``, ``name``, ``start_s``, ``end_s`` (what a trace's timeline gives: an agent
  step, the LLM call, vLLM's phases from its ``llm_request`` span, a tool), with or without chunks.

``plot_request_life`` draws it and returns the Figure; nothing here measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from helpers.core.errors import WorkshopError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from helpers.measure.stream_timing import StreamTiming

SERVER, CLIENT = "server", "client"
PHASES = ("arrival", "queue", "prefill", "decode", "return")  # a request's phases on the server, in order
COLORS = {"arrival": "tab:gray", "queue": "tab:red", "prefill": "tab:orange", "decode": "tab:blue",
          "return": "tab:gray", "request": "lightsteelblue"}


class RequestLifeError(WorkshopError, ValueError):
    """The metrics or rows cannot be one request's life; the message says what to measure instead."""


@dataclass(frozen=True)
class Span:
    """One interval of the picture: its lane (a row: server, client, agent, tool ...), its name, start and end in
    seconds from the picture's origin (the request's send)."""

    lane: str
    name: str
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class RequestLife:
    """What the picture draws: spans in lanes, and the client's chunk arrivals (seconds from the send) with the
    tokens each carried (empty when no client streamed it, e.g. a trace alone)."""

    spans: tuple[Span, ...]
    chunk_s: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=())  # how the spans were placed, said under the picture

    def lanes(self) -> list[str]:
        """The lanes in order of their first span's start (the client's chunks last)."""
        return list(dict.fromkeys(s.lane for s in sorted(self.spans, key=lambda s: s.start_s)))

    def span(self, name: str, lane: str | None = None) -> Span | None:
        """The first span called ``name`` (in ``lane``, when given)."""
        return next((s for s in self.spans if s.name == name and (lane is None or s.lane == lane)), None)


def _one(served: Mapping[str, Any], key: str) -> float | None:
    """The mean of histogram ``key`` over the window when it holds exactly one request; None when absent."""
    count = served.get(f"{key}_count")
    if count is None:
        return None
    if round(count) != 1:
        raise RequestLifeError(f"the server's metrics hold {count:.0f} requests for {key}, not one: scrape just before "
                               "and just after one request with nothing else running (server_metrics.window)")
    return served.get(f"{key}_mean_s")


def server_phases(served: Mapping[str, Any]) -> list[Span]:
    """One request's server phases from a metrics window around it (``server_metrics.window``), in seconds after
    its arrival at the server: arrival, queue, prefill, decode, and return up to its end when the e2e is there."""
    queue, prefill, decode = (_one(served, k) for k in ("queue_time", "prefill_time", "decode_time"))
    if queue is None or prefill is None or decode is None:
        raise RequestLifeError("the metrics lack vLLM's per-request queue, prefill or decode time "
                               "(vllm:request_queue_time_seconds ...): scrape a vLLM server, before and after")
    ttft, e2e = _one(served, "ttft"), _one(served, "e2e")
    first_token = max(queue + prefill, ttft if ttft is not None else queue + prefill)
    queued = first_token - prefill - queue
    spans = [Span(SERVER, "arrival", 0.0, queued), Span(SERVER, "queue", queued, queued + queue),
             Span(SERVER, "prefill", queued + queue, first_token),
             Span(SERVER, "decode", first_token, first_token + decode)]
    if e2e is not None and e2e > first_token + decode:
        spans.append(Span(SERVER, "return", first_token + decode, e2e))
    return [s for s in spans if s.seconds > 0 or s.name in ("queue", "prefill", "decode")]


def from_stream(timing: StreamTiming, served: Mapping[str, Any]) -> RequestLife:
    """The picture's input from one streamed request (``stream_chat``'s timing) and the server's metrics window
    around it alone; the server's arrival is placed at the client's send."""
    if timing.t_first_token is None:
        raise RequestLifeError(f"the request streamed no token ({timing.error or 'no chunk'}): nothing to draw")
    spans = server_phases(served)
    done = (timing.t_done or timing.chunk_times[-1]) - timing.t_sent
    client = Span(CLIENT, "request", 0.0, done)
    notes = ("vLLM reports durations, not times: its phases are placed from the send, prefill ending at the "
             "server's own time to first token" if served.get("ttft_count") else
             "vLLM reports durations, not times: its phases are placed from the send, queue first",)
    return RequestLife((*spans, client), tuple(t - timing.t_sent for t in timing.chunk_times),
                       tuple(timing.chunk_tokens), notes)


def from_rows(rows: Iterable[Mapping[str, Any]], chunk_s: Iterable[float] = (), chunk_tokens: Iterable[int] = (),
              notes: Iterable[str] = ()) -> RequestLife:
    """The picture's input from rows of ``lane``, ``name``, ``start_s`` and ``end_s`` (a trace's timeline), in
    seconds from its origin; chunks (seconds from the same origin) when a client's stream is known too."""
    spans = []
    for i, row in enumerate(rows):
        try:
            span = Span(str(row["lane"]), str(row["name"]), float(row["start_s"]), float(row["end_s"]))
        except (KeyError, TypeError, ValueError) as err:
            raise RequestLifeError(f"row {i} needs lane, name, start_s and end_s (seconds): {err}") from None
        if span.end_s < span.start_s:
            raise RequestLifeError(f"row {i} ({span.name}) ends before it starts: {span.end_s} < {span.start_s} s")
        spans.append(span)
    chunks, tokens = tuple(float(t) for t in chunk_s), tuple(int(k) for k in chunk_tokens)
    if tokens and len(tokens) != len(chunks):
        raise RequestLifeError(f"{len(chunks)} chunk times but {len(tokens)} token counts: give one per chunk")
    return RequestLife(tuple(spans), chunks, tokens or (1,) * len(chunks), tuple(notes))


def _phase(life: RequestLife, name: str) -> Span | None:
    """A server phase, in the server lane or, from a trace, wherever vLLM's phase of that name is."""
    return life.span(name, SERVER) or next((s for s in life.spans if s.name.lower() in (name, f"vllm {name}")), None)


def alignment(life: RequestLife) -> dict[str, float | None]:
    """How the server's phases and the client's chunks line up, in ms: the first chunk's arrival after the prefill's
    end (the first token's way to the client: small and positive when the clocks agree), the last chunk's after the
    decode's end, and the server's queue + prefill against the client's TTFT."""
    prefill, decode, queue = _phase(life, "prefill"), _phase(life, "decode"), _phase(life, "queue")
    first, last = (life.chunk_s[0], life.chunk_s[-1]) if life.chunk_s else (None, None)

    def ms(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round((a - b) * 1000, 3)

    server_ms = None if prefill is None or queue is None else round((queue.seconds + prefill.seconds) * 1000, 3)
    return {"first_chunk_after_prefill_ms": ms(first, prefill.end_s if prefill else None),
            "last_chunk_after_decode_ms": ms(last, decode.end_s if decode else None),
            "queue_plus_prefill_ms": server_ms, "client_ttft_ms": None if first is None else round(first * 1000, 3)}


OTHER_COLORS = ("tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink")  # spans not a phase


def plot_request_life(life: RequestLife, title: str = "One request's life",
                      origin: str = "the request was sent") -> Figure:
    """The request's spans as bars, one lane per row (the server's phases in their colours, other spans by name),
    and beneath them the client's chunk arrivals as ticks, longer for more tokens; x in ms from ``origin``."""
    import matplotlib.pyplot as plt

    lanes = life.lanes() + (["chunks"] if life.chunk_s else [])
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.6 * len(lanes)), constrained_layout=True)
    rows = {lane: len(lanes) - 1 - i for i, lane in enumerate(lanes)}  # the first lane on top
    colors: dict[str, str] = {}
    for span in life.spans:
        key = span.name.lower().removeprefix("vllm ")
        if key not in colors:
            colors[key] = COLORS.get(key) or OTHER_COLORS[sum(k not in COLORS for k in colors) % len(OTHER_COLORS)]
            label = key
        else:
            label = None
        ax.barh(rows[span.lane], max(span.seconds, 0.0) * 1000, left=span.start_s * 1000, height=0.6,
                color=colors[key], edgecolor="black", linewidth=0.5, label=label)
    if life.chunk_s:
        y, biggest = rows["chunks"], max(life.chunk_tokens or (1,))
        ax.vlines([t * 1000 for t in life.chunk_s], [y - 0.1 - 0.2 * k / biggest for k in life.chunk_tokens],
                  [y + 0.1 + 0.2 * k / biggest for k in life.chunk_tokens], color="black", linewidth=1)
        ax.axvline(life.chunk_s[0] * 1000, color="tab:red", linestyle="--", linewidth=1,
                   label=f"first chunk {life.chunk_s[0] * 1000:.0f} ms")
    ax.set_yticks([rows[lane] for lane in lanes], lanes)
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.set_xlabel(f"time since {origin} (ms)" + "".join(f"\n{note}" for note in life.notes), fontsize="small")
    ax.set_title(title)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small", frameon=False)
    return fig
