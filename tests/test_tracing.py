"""The agent's trace without an engine: the spans a scripted run emits (an in-memory exporter), the ``traceparent``
each request carries, the engine flag tracing adds, reading a trace back from Phoenix's REST API (its answer played
by a small local server), vLLM's span split into its phases, and tracing off importing nothing (a fresh process).
The same against the real engine and a real Phoenix: tests/test_tracing_engine.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlparse

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fakes import ToolCall, reply
from helpers.core.vllm_args import EngineConfig, flag_value
from helpers.engine.trace_store import TRACES_FLAG, with_tracing
from helpers.evals.agent import run_agent
from helpers.measure.tracing import (LLM_REQUEST, AgentTracer, children, trace_complete, phoenix_spans, request_phases,
                                     span_from_phoenix, timeline)

QUESTION = "What's the weather in Paris?"


class ScriptedLab:
    """Answers each chat call with the next reply of the script and keeps the keyword arguments it was sent."""

    model = "tiny-agent"

    def __init__(self, *replies):
        self.replies, self.sent = list(replies), []

    def chat(self, messages, **kwargs):
        self.sent.append(kwargs)
        return self.replies.pop(0)


def scripted_run(tracer=None, **kwargs):
    """One tool call, then the answer; ``tracer`` None: run_agent's default (no tracing)."""
    call = ToolCall(id="call-1", function=SimpleNamespace(name="get_weather", arguments=json.dumps({"city": "Paris"})))
    lab = ScriptedLab(reply(calls=[call], prompt_tokens=120, completion_tokens=9),
                      reply("It is 18 C in Paris.", prompt_tokens=170, completion_tokens=7))
    return lab, run_agent(lab, QUESTION, **({"tracer": tracer} if tracer else {}), **kwargs)


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    tracer = AgentTracer(exporter=exporter)
    lab, run = scripted_run(tracer, extra_headers={"X-Session-ID": "s-1"})
    yield tracer, exporter.get_finished_spans(), lab, run
    tracer.shutdown()


def test_a_run_is_one_trace_a_span_for_the_run_each_model_call_and_each_tool_call(traced):
    tracer, spans, _, run = traced
    names = [s.name for s in spans]
    assert sorted(names) == sorted(["invoke_agent workshop-agent", "chat tiny-agent", "execute_tool get_weather",
                                    "chat tiny-agent"])
    assert {format(s.context.trace_id, "032x") for s in spans} == {tracer.last_trace_id}
    root = next(s for s in spans if s.name.startswith("invoke_agent"))
    assert root.parent is None and all(s.parent.span_id == root.context.span_id for s in spans if s is not root)
    calls = sorted((s for s in spans if s.name.startswith("chat")), key=lambda s: s.start_time)
    tool = next(s for s in spans if s.name.startswith("execute_tool"))
    assert calls[0].end_time <= tool.start_time <= tool.end_time <= calls[1].start_time  # beside, in order
    assert run.answer == "It is 18 C in Paris."


def test_the_spans_carry_the_genai_attributes(traced):
    _, spans, _, _ = traced
    calls = sorted((s for s in spans if s.name.startswith("chat")), key=lambda s: s.start_time)
    first = calls[0].attributes
    assert first["gen_ai.operation.name"] == "chat" and first["gen_ai.request.model"] == "tiny-agent"
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (120, 9)
    assert calls[1].attributes["gen_ai.usage.input_tokens"] == 170 and first["gen_ai.request.max_tokens"] == 96
    tool = next(s for s in spans if s.name.startswith("execute_tool")).attributes
    assert tool["gen_ai.tool.name"] == "get_weather" and tool["gen_ai.tool.call.id"] == "call-1"
    assert tool["gen_ai.operation.name"] == "execute_tool"
    assert {s.attributes["openinference.span.kind"] for s in spans} == {"AGENT", "LLM", "TOOL"}


def test_each_request_sends_the_traceparent_of_its_own_call_span_beside_its_other_headers(traced):
    _, spans, lab, _ = traced
    calls = sorted((s for s in spans if s.name.startswith("chat")), key=lambda s: s.start_time)
    for sent, span in zip(lab.sent, calls):
        version, trace_id, parent_id, flags = sent["extra_headers"]["traceparent"].split("-")
        assert (version, trace_id, parent_id) == ("00", format(span.context.trace_id, "032x"),
                                                 format(span.context.span_id, "016x"))
        assert int(flags, 16) & 1  # sampled: vLLM records it
        assert sent["extra_headers"]["X-Session-ID"] == "s-1"  # the caller's own headers stay


def test_an_untraced_run_sends_no_trace_header():
    lab, run = scripted_run()
    assert all("traceparent" not in (sent.get("extra_headers") or {}) for sent in lab.sent) and run.answer


def test_tracing_off_imports_no_opentelemetry_sdk_nor_exporter():
    """A fresh process: an untraced run, then which OpenTelemetry modules are loaded."""
    code = """
import json, sys
sys.path.insert(0, "tests")
from types import SimpleNamespace
from fakes import ToolCall, reply
from helpers.evals.agent import run_agent

class Lab:
    model = "m"
    def __init__(self): self.replies = [reply(calls=[ToolCall(id="c", function=SimpleNamespace(name="get_weather",
                                          arguments='{"city": "Paris"}'))]), reply("done")]
    def chat(self, messages, **kwargs): return self.replies.pop(0)

assert run_agent(Lab(), "q").answer == "done"
print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert not [m for m in loaded if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))], loaded


def test_tracing_adds_the_endpoint_flag_and_http_export_and_the_default_has_neither():
    plain = EngineConfig("m", "m", ("--max-model-len", "4096"), (("VLLM_CPU_KVCACHE_SPACE", "1"),))
    traced = with_tracing(plain, "http://127.0.0.1:6006/v1/traces")
    assert flag_value(traced.args, TRACES_FLAG) == "http://127.0.0.1:6006/v1/traces"
    assert flag_value(traced.args, "--max-model-len") == "4096"
    env = dict(traced.env)
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert with_tracing(traced, "http://127.0.0.1:7000/v1/traces").args.count(TRACES_FLAG) == 1
    from helpers.core.settings import load_settings
    from helpers.engine.interface import default_config

    assert flag_value(default_config(load_settings()).args, TRACES_FLAG) is None
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in dict(default_config(load_settings()).env)


# ---------------------------------------------------------------- reading back (synthetic spans)

T0 = 1_767_000_000.0


def iso(seconds: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat()


def phoenix_span(name, span_id, parent, start, end, attributes, trace_id="ab" * 16):
    """A span as Phoenix's ``GET /v1/projects/{project}/spans`` returns it (phoenix/server/api/routers/v1/spans.py)."""
    return {"id": f"U3Bhbj{span_id}", "name": name, "context": {"trace_id": trace_id, "span_id": span_id},
            "span_kind": "UNKNOWN", "parent_id": parent, "start_time": iso(start), "end_time": iso(end),
            "status_code": "UNSET", "status_message": "", "attributes": attributes, "events": []}


VLLM_ATTRIBUTES = {"gen_ai.latency.time_in_queue": 0.002, "gen_ai.latency.time_in_model_prefill": 0.05,
                   "gen_ai.latency.time_in_model_decode": 0.3, "gen_ai.latency.time_to_first_token": 0.07,
                   "gen_ai.latency.e2e": 0.38, "gen_ai.usage.prompt_tokens": 120}
SYNTHETIC = [
    phoenix_span("invoke_agent workshop-agent", "r0", None, T0, T0 + 1.0, {"gen_ai.operation.name": "invoke_agent"}),
    phoenix_span("chat tiny-agent", "c1", "r0", T0 + 0.01, T0 + 0.42, {"gen_ai.operation.name": "chat"}),
    phoenix_span(LLM_REQUEST, "v1", "c1", T0 + 0.02, T0 + 0.40, VLLM_ATTRIBUTES),
    phoenix_span("execute_tool get_weather", "t1", "r0", T0 + 0.43, T0 + 0.44,
                 {"gen_ai": {"tool": {"name": "get_weather"}}, "gen_ai.operation.name": "execute_tool"}),
    phoenix_span("other trace", "x1", None, T0, T0 + 0.1, {}, trace_id="cd" * 16),
]


@pytest.fixture
def phoenix_double():
    """A local HTTP server answering Phoenix's span search, two pages long, filtered by trace_id."""
    asked = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            url = urlparse(self.path)
            query = parse_qs(url.query)
            asked.append((url.path, query))
            spans = [s for s in SYNTHETIC if s["context"]["trace_id"] in query.get("trace_id", [])]
            page, cursor = (spans[:2], "page-2") if "cursor" not in query else (spans[2:], None)
            body = json.dumps({"data": page, "next_cursor": cursor}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", asked
    server.shutdown()


def test_a_trace_is_read_back_through_phoenix_span_search_every_page_oldest_first(phoenix_double):
    url, asked = phoenix_double
    spans = phoenix_spans(url, "ab" * 16)
    assert [s["name"] for s in spans] == ["invoke_agent workshop-agent", "chat tiny-agent", LLM_REQUEST,
                                          "execute_tool get_weather"]
    assert asked[0][0] == "/v1/projects/default/spans" and len(asked) == 2  # both pages
    vllm = spans[2]
    assert vllm["parent"] == "c1" and vllm["start_s"] == pytest.approx(T0 + 0.02, abs=1e-5)
    assert spans[3]["attributes"]["gen_ai.tool.name"] == "get_weather"  # nested names flattened
    assert [s["name"] for s in children(spans, spans[0])] == ["chat tiny-agent", "execute_tool get_weather"]


def test_an_unreachable_phoenix_says_what_to_do():
    with pytest.raises(ConnectionError, match="start it with"):
        phoenix_spans("http://127.0.0.1:9", "ab" * 16, timeout_s=2)


def test_vllm_span_splits_into_phases_that_end_at_the_first_token_and_fill_the_span():
    span = span_from_phoenix(SYNTHETIC[2])
    phases = {p["name"]: p for p in request_phases(span)}
    assert list(phases) == ["arrival", "queue", "prefill", "decode", "return"]
    assert phases["prefill"]["end_s"] == pytest.approx(span["start_s"] + 0.07, abs=1e-5)  # the first token
    assert phases["queue"]["end_s"] - phases["queue"]["start_s"] == pytest.approx(0.002, abs=1e-5)
    assert phases["decode"]["end_s"] - phases["decode"]["start_s"] == pytest.approx(0.3, abs=1e-5)
    assert phases["arrival"]["start_s"] == span["start_s"] and phases["return"]["end_s"] == span["end_s"]
    ordered = list(phases.values())
    assert all(a["end_s"] == pytest.approx(b["start_s"], abs=1e-5) for a, b in zip(ordered, ordered[1:]))


def test_phases_longer_than_the_span_never_make_an_interval_run_backwards():
    """Edge case: vLLM's durations come from other clocks than the span's ends; a phase never ends before it starts."""
    span = span_from_phoenix(phoenix_span(LLM_REQUEST, "v", None, T0, T0 + 0.1, {
        **VLLM_ATTRIBUTES, "gen_ai.latency.time_in_model_decode": 0.5}))
    assert all(p["end_s"] >= p["start_s"] >= span["start_s"] for p in request_phases(span))


def test_the_timeline_puts_each_span_in_its_lane_from_the_run_start():
    spans = [span_from_phoenix(s) for s in SYNTHETIC[:4]]
    rows = timeline(spans)
    assert [r["lane"] for r in rows] == ["agent", "llm"] + ["server"] * 5 + ["tool"]
    assert rows[0]["start_s"] == 0 and rows[-1]["name"] == "execute_tool get_weather"
    assert rows[-1]["start_s"] == pytest.approx(0.43, abs=1e-5)
    assert [r["name"] for r in rows if r["lane"] == "server"] == ["arrival", "queue", "prefill", "decode", "return"]
    assert timeline([]) == []


def test_the_timeline_feeds_the_request_life_picture_as_it_is():
    from helpers.measure.request_life import from_rows

    life = from_rows(timeline([span_from_phoenix(s) for s in SYNTHETIC[:4]]))
    assert {s.name for s in life.spans if s.lane == "server"} == {"arrival", "queue", "prefill", "decode", "return"}


def test_a_trace_is_complete_only_with_the_agents_root_and_every_vllm_span_under_a_call():
    agent = [{"name": "invoke_agent workshop-agent", "parent": None}, {"name": "chat tiny-agent", "parent": "r"}]
    vllm = [{"name": LLM_REQUEST, "parent": "c1"}, {"name": LLM_REQUEST, "parent": "c2"}]
    assert trace_complete(agent + vllm, 2)
    assert not trace_complete(agent + vllm[:1], 2)  # a vLLM span still to come
    orphans = [{"name": LLM_REQUEST, "parent": None}, {"name": LLM_REQUEST, "parent": None}]
    assert not trace_complete(orphans, 2)  # vLLM's spans in, the agent's not yet (seen on a busy machine)
    assert not trace_complete(vllm, 2)  # no root of the run
