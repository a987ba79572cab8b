"""One trace per agent run: the agent's own spans sent over OTLP, and the whole trace read back from the trace store.

**Writing.** ``run_agent(lab, question, tracer=AgentTracer(endpoint))`` emits one span for the run, one per LLM
call and one per tool call, named and labelled as OpenTelemetry's GenAI semantic conventions say
(``invoke_agent``, ``chat {model}``, ``execute_tool {name}``; ``gen_ai.request.model``,
``gen_ai.usage.input_tokens``/``output_tokens``, ``gen_ai.tool.name`` ...), plus OpenInference's
``openinference.span.kind`` so that Arize Phoenix labels them AGENT, LLM and TOOL. Each LLM call sends a W3C
``traceparent`` header naming its span (the OpenAI client's ``extra_headers``), so a vLLM started with
``--otlp-traces-endpoint`` (helpers/engine/trace_store.py) parents its ``llm_request`` span on it.

**Off by default.** Without a tracer the loop runs ``NO_TRACE``, whose hooks do nothing; this module imports
OpenTelemetry only inside ``AgentTracer``, so an untraced run never imports its SDK or an exporter.

**Reading.** ``phoenix_spans`` reads one trace back through Phoenix's REST API (``GET /v1/projects/{project}/spans``)
as plain dicts, one per span, oldest first::

    {"name": "llm_request", "span_id": "…", "parent": "…" or None, "trace_id": "…",
     "start_s": 1767000000.12, "end_s": 1767000000.48, "attributes": {"gen_ai.latency.time_in_queue": 0.001, …}}

(``start_s``/``end_s``: Unix seconds). ``request_phases`` splits vLLM's ``llm_request`` span into its phases from
the ``gen_ai.latency.*`` attributes vLLM sets (vllm/v1/engine/output_processor.py, ``do_tracing``), and
``timeline`` turns a whole trace into rows for a picture: lane, name, start and end in seconds from the run's start.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

AGENT_NAME = "workshop-agent"
LLM_REQUEST = "llm_request"  # vLLM's span for one request (vllm/v1/engine/output_processor.py)
# vLLM's per-request latencies, seconds (vllm/tracing/utils.py, SpanAttributes)
QUEUE, PREFILL, DECODE, TTFT, E2E = ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_in_model_prefill",
                                     "gen_ai.latency.time_in_model_decode", "gen_ai.latency.time_to_first_token",
                                     "gen_ai.latency.e2e")
PHASES = (("queue", QUEUE), ("prefill", PREFILL), ("decode", DECODE))


# ---------------------------------------------------------------- writing: the agent's spans

class _NoCall:
    """An untraced LLM call: the request goes out as it is."""

    def request_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return kwargs

    def finished(self, response: Any) -> None:
        pass


class NoTrace:
    """The hooks of an untraced run: they do nothing and import nothing."""

    last_trace_id: str | None = None

    @contextmanager
    def run(self, question: str) -> Iterator[None]:
        yield None

    @contextmanager
    def llm_call(self, step: int, model: str | None, kwargs: dict[str, Any]) -> Iterator[_NoCall]:
        yield _NoCall()

    @contextmanager
    def tool_call(self, name: str, call_id: str | None) -> Iterator[None]:
        yield None


NO_TRACE = NoTrace()


class _TracedCall:
    """One traced LLM call: adds ``traceparent`` to the request and the server's token counts to the span."""

    def __init__(self, span: Any, headers: dict[str, str]) -> None:
        self.span, self.headers = span, headers

    def request_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The request's keyword arguments with this span's ``traceparent`` among its extra headers."""
        return {**kwargs, "extra_headers": {**(kwargs.get("extra_headers") or {}), **self.headers}}

    def finished(self, response: Any) -> None:
        usage, choice = getattr(response, "usage", None), response.choices[0]
        attributes = {"gen_ai.response.id": getattr(response, "id", None),
                      "gen_ai.response.model": getattr(response, "model", None),
                      "gen_ai.response.finish_reasons": [getattr(choice, "finish_reason", None) or "unknown"],
                      "gen_ai.usage.input_tokens": getattr(usage, "prompt_tokens", None),
                      "gen_ai.usage.output_tokens": getattr(usage, "completion_tokens", None),
                      "llm.token_count.prompt": getattr(usage, "prompt_tokens", None),  # OpenInference's names
                      "llm.token_count.completion": getattr(usage, "completion_tokens", None)}
        self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})


class AgentTracer:
    """The agent's spans, exported over OTLP/HTTP to ``endpoint`` (e.g. Phoenix's ``http://127.0.0.1:6006/v1/traces``),
    or to ``exporter`` (any OpenTelemetry SpanExporter, e.g. an in-memory one in a test) as each span ends.

    It keeps its own TracerProvider (the process's global one is left alone); ``last_trace_id`` is the trace of the
    latest run, as 32 hex digits; ``flush`` waits until every ended span is exported."""

    def __init__(self, endpoint: str | None = None, exporter: Any = None, service_name: str = AGENT_NAME) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        if (endpoint is None) == (exporter is None):
            raise ValueError("AgentTracer needs one of endpoint= (an OTLP/HTTP traces URL) or exporter=, not both")
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=10)))
        else:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("helpers.evals.agent")
        self.last_trace_id: str | None = None

    @contextmanager
    def run(self, question: str) -> Iterator[Any]:
        with self.tracer.start_as_current_span(f"invoke_agent {AGENT_NAME}", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": AGENT_NAME,
                "openinference.span.kind": "AGENT", "input.value": question}) as span:
            self.last_trace_id = format(span.get_span_context().trace_id, "032x")
            yield span
        self.flush()

    @contextmanager
    def llm_call(self, step: int, model: str | None, kwargs: dict[str, Any]) -> Iterator[_TracedCall]:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": model,
                      "gen_ai.request.max_tokens": kwargs.get("max_tokens"),
                      "gen_ai.request.temperature": kwargs.get("temperature"), "workshop.agent.step": step,
                      "openinference.span.kind": "LLM", "llm.model_name": model}
        with self.tracer.start_as_current_span(f"chat {model}", kind=trace.SpanKind.CLIENT,
                                               attributes={k: v for k, v in attributes.items() if v is not None}) as span:
            headers: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(headers, context=trace.set_span_in_context(span))
            yield _TracedCall(span, headers)

    @contextmanager
    def tool_call(self, name: str, call_id: str | None) -> Iterator[Any]:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id,
                      "openinference.span.kind": "TOOL", "tool.name": name}
        with self.tracer.start_as_current_span(f"execute_tool {name}", attributes={
                k: v for k, v in attributes.items() if v is not None}) as span:
            yield span

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export every ended span now; False if that took longer than ``timeout_s``."""
        return bool(self.provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        self.provider.shutdown()


# ---------------------------------------------------------------- reading: a trace back from Phoenix

def _seconds(stamp: str | float | int) -> float:
    """Unix seconds from an ISO 8601 time (Phoenix's ``start_time``) or a number of nanoseconds."""
    if isinstance(stamp, (int, float)):
        return float(stamp) / 1e9
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def span_from_phoenix(raw: dict[str, Any]) -> dict[str, Any]:
    """One span of Phoenix's REST API (``/v1/projects/{project}/spans``) as this module's plain dict."""
    context = raw.get("context") or {}
    attributes = raw.get("attributes") or {}
    if isinstance(attributes, str):
        attributes = json.loads(attributes)
    return {"name": raw["name"], "span_id": context.get("span_id") or raw.get("span_id"),
            "parent": raw.get("parent_id") or None, "trace_id": context.get("trace_id") or raw.get("trace_id"),
            "start_s": _seconds(raw["start_time"]), "end_s": _seconds(raw["end_time"]),
            "attributes": _flat(attributes)}


def _flat(attributes: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"gen_ai": {"latency": {"e2e": 1}}}`` -> ``{"gen_ai.latency.e2e": 1}`` (Phoenix nests dotted names)."""
    flat: dict[str, Any] = {}
    for key, value in attributes.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flat(value, name + "."))
        else:
            flat[name] = value
    return flat


def _get_json(url: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def phoenix_spans(base_url: str, trace_id: str, project: str = "default", timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Every span Phoenix holds for one trace (``trace_id``: 32 hex digits), oldest first, as plain dicts."""
    spans, cursor = [], None
    while True:
        query = {"trace_id": trace_id, "limit": 1000, **({"cursor": cursor} if cursor else {})}
        url = f"{base_url.rstrip('/')}/v1/projects/{urllib.parse.quote(project)}/spans?{urllib.parse.urlencode(query)}"
        try:
            page = _get_json(url, timeout_s)
        except urllib.error.URLError as err:
            raise ConnectionError(f"Phoenix at {base_url} did not answer ({err}): start it with "
                                  "helpers.engine.trace_store.TraceStore, or check its URL.") from None
        spans += [span_from_phoenix(raw) for raw in page.get("data", [])]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    return sorted((s for s in spans if s["trace_id"] == trace_id), key=lambda s: s["start_s"])


def wait_for_spans(read: Callable[[], list[dict[str, Any]]], done: Callable[[list[dict[str, Any]]], bool],
                   timeout_s: float = 30.0, every_s: float = 0.5) -> list[dict[str, Any]]:
    """Call ``read()`` (e.g. ``lambda: phoenix_spans(url, trace_id)``) until ``done(spans)`` (vLLM exports in
    batches, so its spans come a moment after the agent's); the last read if ``timeout_s`` runs out first."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = read()
        if done(spans) or time.monotonic() > deadline:
            return spans
        time.sleep(every_s)


# ---------------------------------------------------------------- a trace as a picture's input

def trace_complete(spans: list[dict[str, Any]], model_calls: int) -> bool:
    """True when a stored trace holds an agent run whole: a vLLM span for each of ``model_calls`` calls, each under
    a span of the agent's, and the run's own root. The agent's spans and vLLM's reach the store apart (each process
    exports on its own clock), so on a busy machine either may come first; ``wait_for_spans`` waits on this."""
    llm = [s for s in spans if s["name"] == LLM_REQUEST]
    return (len(llm) >= model_calls and all(s["parent"] for s in llm)
            and any(s["parent"] is None and s["name"] != LLM_REQUEST for s in spans))


def children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    """The spans whose parent is ``parent``, oldest first."""
    return [s for s in spans if s["parent"] == parent["span_id"]]


def request_phases(span: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's ``llm_request`` span as its phases, in Unix seconds: ``arrival`` (the server's front end: the chat
    template, tokenizing, handing it to the engine core), ``queue``, ``prefill``, ``decode``, then ``return`` (the last
    token's way out). Queue, prefill and decode are vLLM's own durations; they are placed so that prefill ends at the
    first token (``time_to_first_token`` after the span's start), and ``arrival`` is what is left before the queue."""
    a = span["attributes"]
    queue, prefill, decode = (float(a[key]) for _, key in PHASES)
    first_token = span["start_s"] + float(a.get(TTFT, queue + prefill))
    queued = max(span["start_s"], first_token - prefill - queue)
    cuts = [span["start_s"], queued, queued + queue, first_token, first_token + decode, span["end_s"]]
    names = ["arrival", "queue", "prefill", "decode", "return"]
    return [{"name": n, "start_s": cuts[i], "end_s": max(cuts[i], cuts[i + 1])} for i, n in enumerate(names)]


def lane(span: dict[str, Any]) -> str:
    """Which row of the picture a span goes in: agent, llm (the agent's call), server (vLLM's span), tool."""
    if span["name"] == LLM_REQUEST:
        return "server"
    kind = span["attributes"].get("gen_ai.operation.name")
    return {"invoke_agent": "agent", "chat": "llm", "execute_tool": "tool"}.get(kind, "other")


def timeline(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One trace as rows for a timeline: lane, name, start_s and end_s in seconds from the trace's first span;
    each ``llm_request`` comes as its phases (``request_phases``: ``arrival``, ``queue`` ... in lane ``server``).
    ``helpers.measure.request_life.from_rows`` takes these rows as they are and draws them."""
    if not spans:
        return []
    t0 = min(s["start_s"] for s in spans)
    rows = []
    for span in sorted(spans, key=lambda s: s["start_s"]):
        if span["name"] == LLM_REQUEST:
            rows += [{"lane": "server", "name": p["name"], "start_s": p["start_s"] - t0,
                      "end_s": p["end_s"] - t0} for p in request_phases(span)]
        else:
            rows.append({"lane": lane(span), "name": span["name"], "start_s": span["start_s"] - t0,
                         "end_s": span["end_s"] - t0})
    return rows
