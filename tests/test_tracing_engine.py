"""One trace per agent run, against the real local engine and a real Arize Phoenix, read back through Phoenix's own
REST API: vLLM's ``llm_request`` span sits under the agent's LLM-call span, its phases (``gen_ai.latency.*``) are
above 0 and add up to no more than the span, and the tool spans sit beside the calls, under the run.

One engine start for the file (tiny-agent, the default configuration with ``--otlp-traces-endpoint``: tracing is a
restart), its own state directory, stopped at the end; one Phoenix of its own on a free port.

Phoenix missing: in CI (``CI`` set) the tests fail; elsewhere they skip with the line that installs it
(``bash install/phoenix.sh``), as tests/test_dashboard_prometheus.py does for Prometheus.
"""

from __future__ import annotations

import os
import statistics

import pytest

from fakes import engine_environment
from helpers.engine import trace_store
from helpers.engine.trace_store import INSTALL_PHOENIX, TraceStore, phoenix_executable, with_tracing
from helpers.evals.agent import run_agent
from helpers.measure.tracing import (LLM_REQUEST, PHASES, AgentTracer, children, phoenix_spans, trace_complete,
                                     wait_for_spans)

PORT = os.environ.get("WORKSHOP_TEST_PORT", "8765")
WEATHER_QUESTION = "What's the weather in Paris?"


def require_phoenix() -> None:
    """Phoenix's command is there; fails in CI, skips with the install line elsewhere."""
    if phoenix_executable() is None:
        if os.environ.get("CI"):
            pytest.fail(f"{INSTALL_PHOENIX} (.ci/run installs it; in CI this test never skips)")
        pytest.skip(INSTALL_PHOENIX)


def test_a_missing_phoenix_fails_in_ci_and_says_how_to_install_it_elsewhere(monkeypatch, tmp_path):
    monkeypatch.setenv(trace_store.PHOENIX_VARIABLE, str(tmp_path / "no-phoenix"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="bash install/phoenix.sh"):
        require_phoenix()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="bash install/phoenix.sh") as skipped:
        require_phoenix()
    assert "\n" not in str(skipped.value.msg)  # one line


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    require_phoenix()
    with TraceStore(working_dir=tmp_path_factory.mktemp("phoenix")) as running:
        yield running


@pytest.fixture(scope="module")
def lab(store, tmp_path_factory):
    from helpers.core.settings import load_settings
    from helpers.engine.interface import default_config
    from helpers.engine.session import Lab, make_client
    from helpers.engine.local import LocalEngine

    with engine_environment(PORT, tmp_path_factory.mktemp("tracing-engine")):
        settings = load_settings()
        engine = LocalEngine(settings)
        try:
            engine.start(with_tracing(default_config(settings), store.otlp_endpoint))
            yield Lab(settings, engine, make_client(settings))
        finally:
            engine.stop()


@pytest.fixture(scope="module")
def traced(store, lab):
    """One traced agent run and its trace as Phoenix returns it (once every model call's vLLM span is in)."""
    tracer = AgentTracer(store.otlp_endpoint)
    run = run_agent(lab, WEATHER_QUESTION, tracer=tracer)
    tracer.shutdown()
    spans = wait_for_spans(lambda: phoenix_spans(store.url, tracer.last_trace_id),
                           lambda found: trace_complete(found, len(run.steps)), 60)
    return run, spans


@pytest.mark.engine
def test_vllm_request_spans_sit_under_the_agent_llm_call_spans(traced):
    run, spans = traced
    names = [s["name"] for s in spans]
    assert names.count(LLM_REQUEST) == len(run.steps) >= 1, names
    roots = [s for s in spans if s["parent"] is None]
    assert [r["name"] for r in roots] == ["invoke_agent workshop-agent"], names
    calls = [s for s in children(spans, roots[0]) if s["attributes"].get("gen_ai.operation.name") == "chat"]
    assert len(calls) == len(run.steps)
    for call, step in zip(calls, run.steps):
        (request,) = children(spans, call)
        assert request["name"] == LLM_REQUEST
        assert call["start_s"] <= request["start_s"] <= request["end_s"] <= call["end_s"]  # one machine, one clock
        # the server's count and the agent's (from the response's usage) agree
        assert request["attributes"]["gen_ai.usage.prompt_tokens"] == step.prompt_tokens
        assert call["attributes"]["gen_ai.usage.input_tokens"] == step.prompt_tokens
        assert call["attributes"]["gen_ai.request.model"] == call["attributes"]["gen_ai.response.model"]


@pytest.mark.engine
def test_vllm_phases_are_above_zero_and_fit_in_its_span(traced):
    _, spans = traced
    for request in (s for s in spans if s["name"] == LLM_REQUEST):
        phases = {name: float(request["attributes"][key]) for name, key in PHASES}
        ttft = float(request["attributes"]["gen_ai.latency.time_to_first_token"])
        assert all(v > 0 for v in phases.values()) and ttft > 0, phases
        assert sum(phases.values()) <= request["end_s"] - request["start_s"], (phases, request)


@pytest.mark.engine
def test_tool_spans_sit_beside_the_calls_under_the_run(traced):
    run, spans = traced
    root = next(s for s in spans if s["parent"] is None)
    tools = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "execute_tool"]
    asked = [c["name"] for step in run.steps for c in step.tool_calls]
    assert asked and [t["attributes"]["gen_ai.tool.name"] for t in tools] == asked
    calls = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat"]
    for tool in tools:
        assert tool["parent"] == root["span_id"]
        before = [c for c in calls if c["end_s"] <= tool["start_s"]]
        assert before, "a tool span starts before any model call ended"


@pytest.mark.engine
def test_tracing_cost_per_request_a_b(store, lab, capsys):
    """A figure, not a threshold: each model call's latency, untraced and traced runs interleaved (off, on, on, off,
    ...) on the one traced engine: what the agent's spans and the traceparent add. The engine's own share (its span
    per request) is on in both; measuring it takes a restart without the flag."""
    tracer = AgentTracer(store.otlp_endpoint)
    latencies: dict[str, list[float]] = {"off": [], "on": []}
    for order in (("off", "on"), ("on", "off")) * 3:
        for mode in order:
            run = run_agent(lab, WEATHER_QUESTION, **({"tracer": tracer} if mode == "on" else {}))
            latencies[mode] += [s.latency_s for s in run.steps]
    tracer.shutdown()
    off, on = (statistics.median(latencies[m]) * 1000 for m in ("off", "on"))
    with capsys.disabled():
        print(f"\ntracing cost per request: median {off:.1f} ms untraced, {on:.1f} ms traced "
              f"({len(latencies['off'])} and {len(latencies['on'])} requests)")
    assert len(latencies["off"]) >= 6 and len(latencies["on"]) >= 6
