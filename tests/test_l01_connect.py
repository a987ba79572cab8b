"""Notebook 01's lesson: the conclusions on one streamed request, the agent's growing context and renting against
owning, and the outcomes of its two exercises, each fed numbers both ways."""

import pytest

from helpers.core.conclusion import NOT_SHOWN, SHOWN
from helpers.lessons.l01_connect import (LENGTH_CHOICES, conclude_context_growth, conclude_rent_vs_own, conclude_stream,
                                         length_outcome, tool_tax_outcome)
from fakes import recorded_stream


make = recorded_stream


def steady(n=20, gap=0.02):
    return make([(0.1 + i * gap, i + 1, "x") for i in range(n)])


# ---------------------------------------------------------------- one streamed request

def test_steady_stream_is_shown():
    out = conclude_stream(steady())
    assert out[1].verdict == SHOWN and "longest of 20.0 ms" in out[1].text


def test_a_stall_flips_the_verdict_and_is_named():
    events = [(0.1 + i * 0.02, i + 1, "x") for i in range(19)] + [(0.1 + 18 * 0.02 + 1.26, 20, "y")]
    out = conclude_stream(make(events))
    assert out[1].verdict == NOT_SHOWN
    assert "one gap of 1,260 ms before token 20" in out[1].text and "a stall" in out[1].text


def test_too_few_tokens_is_not_shown():
    assert conclude_stream(make([(0.1, 1, "a")]))[0].verdict == NOT_SHOWN


# ---------------------------------------------------------------- the agent's context tax

def test_growing_prompt_is_shown():
    c = conclude_context_growth([300, 420, 560, 700], [20, 15, 18, 22])
    assert c.verdict == SHOWN and "300 to 700 tokens (2.3x)" in c.text


def test_flat_prompt_is_not_shown():
    c = conclude_context_growth([300, 310, 305], [20, 15, 18])
    assert c.verdict == NOT_SHOWN and "grew less than 1.5x" in c.text


def test_one_call_is_not_enough():
    assert conclude_context_growth([300], [20]).verdict == NOT_SHOWN


# ---------------------------------------------------------------- rent vs own

def test_rent_vs_own_sentence_flips_with_the_numbers() -> None:
    dear = conclude_rent_vs_own(7.0, 70.0, 1000, 100, 10.0, 0.1, "cpu")
    cheap = conclude_rent_vs_own(7.0, 0.7, 1000, 100, 10.0, 0.1, "gpu")
    assert "owning is 10.0x dearer" in dear[0].text and "per million output tokens" in dear[0].text
    assert "owning is 10.0x cheaper" in cheap[0].text
    assert "A CPU's tokens/s says nothing of a GPU's" in dear[1].text
    assert "CPU" not in cheap[1].text


# ---------------------------------------------------------------- the exercises

def _length_rows(ttft_short, ttft_long, total_short, total_long):
    return [{"max_tokens": n, "round": r, "ttft_s": ttft, "e2e_s": total, "completion_tokens": n}
            for r in (1, 2) for n, ttft, total in ((32, ttft_short, total_short), (64, ttft_long, total_long))]


@pytest.mark.parametrize("times, outcome", [
    ((0.02, 0.021, 0.5, 1.0), "only the total time grows"),
    ((0.02, 0.05, 0.5, 1.0), "both grow"),
    ((0.02, 0.05, 0.5, 0.52), "only TTFT grows"),
    ((0.02, 0.02, 0.5, 0.5), "neither grows"),
])
def test_the_longer_answer_outcome_follows_the_medians_either_way(times, outcome):
    got, detail = length_outcome(_length_rows(*times))
    assert got == outcome and got in LENGTH_CHOICES
    assert "max_tokens 32 -> 64" in detail and "medians of 2 rounds" in detail


def test_the_tool_tax_outcome_goes_both_ways():
    outcome, detail = tool_tax_outcome(20, 260, 4)
    assert outcome == "more" and "+240 tokens (+60 per tool)" in detail
    assert tool_tax_outcome(20, 20, 4)[0] == "about the same"
    assert tool_tax_outcome(200, 20, 4)[0] == "fewer"


# ---------------------------------------------------------------- rent vs own: dated prices, cached input, break-even

from helpers.hardware.gpus import api_price, hourly_price  # noqa: E402
from helpers.lessons.l01_connect import (conclude_break_even, conclude_cache, engine_price, not_cost_table,  # noqa: E402
                                         rent_vs_own_costs, runtimes_table)


def test_engine_price_comes_from_the_table_or_the_parameter() -> None:
    usd, source = engine_price("cpu")
    assert usd == hourly_price("2-vCPU VM").usd_per_hour and "e2-standard-2" in source and "2025" in source
    assert engine_price("gpu")[0] == hourly_price("H100 SXM").usd_per_hour
    assert engine_price("cpu", 0.5) == (0.5, "your HOURLY_USD parameter")
    with pytest.raises(ValueError, match="positive"):
        engine_price("cpu", 0)


def test_cached_input_only_counts_from_the_apis_minimum_prefix() -> None:
    api = api_price("gpt-4.1-mini")
    short = rent_vs_own_costs([300, 420, 560], [20, 15, 18], 3.0, api, 0.067, "cpu")
    assert list(short["cached_prompt_tokens"]) == [0, 0, 0]
    assert short.usd_per_million_output_tokens.iloc[0] == short.usd_per_million_output_tokens.iloc[1]
    assert "none of the 1,280 prompt tokens" in conclude_cache(short, 1280, api).text
    long = rent_vs_own_costs([1500, 1700, 1900], [100, 100, 100], 3.0, api, 0.067, "cpu")
    assert long["cached_prompt_tokens"].iloc[1] == 1600 + 1800
    assert long.usd_per_million_output_tokens.iloc[1] < long.usd_per_million_output_tokens.iloc[0]
    assert "3,400 of the 5,100 prompt tokens" in conclude_cache(long, 5100, api).text
    assert long.usd_per_million_output_tokens.iloc[2] == pytest.approx(0.067 * 3.0 / 3600 / 300 * 1e6)


def test_break_even_flips_with_the_numbers() -> None:
    never = conclude_break_even(2.0, 3.99, 20.0, "gpu")  # 3.99 USD/h at 20 tok/s: 55 USD per M tokens
    assert "never pays off" in never.text
    pays = conclude_break_even(2.0, 3.99, 2000.0, "gpu")  # 0.55 USD per M at full speed
    assert "busy 28% of the day" in pays.text and "owning is" in pays.text


def test_what_is_not_cost_and_the_other_runtimes_have_their_sources() -> None:
    table = not_cost_table(123.4)
    assert list(table["not cost"]) == ["data control", "regulation", "service level", "latency"]
    assert "123 ms" in table.loc[3, "an engine you run"]
    runtimes = runtimes_table()
    assert {"SGLang", "TensorRT-LLM", "llama.cpp", "Ollama"} == set(runtimes["runtime"])
    assert all("." in s for s in runtimes["source"])  # every row names where it was read


# ---------------------------------------------------------------- the workshop model thinks

from dataclasses import replace  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from fakes import RecordingEngine  # noqa: E402
from helpers.core.settings import load_settings  # noqa: E402
from helpers.core.vllm_args import EngineConfig, flag_value  # noqa: E402
from helpers.evals.agent import AgentRun, AgentStep  # noqa: E402
from helpers.lessons.l01_connect import conclude_thinking, thinking_model_served  # noqa: E402

TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
K8S = load_settings({"VLLM_HOST": "http://vllm-engine:8000/v1", "NAMESPACE": "ws-01"})


def _lab(settings, config, reconfigurable=True):
    engine = RecordingEngine(config)
    engine.reconfigurable = reconfigurable
    return SimpleNamespace(settings=settings, engine=engine, model=config.served_name)


def test_on_the_cluster_the_thinking_model_is_the_baseline_and_nothing_restarts(capsys):
    baseline = EngineConfig("Qwen/Qwen3-4B", "Qwen/Qwen3-4B", (*TOOL_FLAGS, "--reasoning-parser", "qwen3"))
    lab = _lab(K8S, baseline)
    with thinking_model_served(lab) as model:
        assert model == "Qwen/Qwen3-4B"
    assert lab.engine.applied == [] and "no restart" in capsys.readouterr().out


def test_an_engine_that_restarts_serves_the_stand_in_with_the_parser_and_the_baseline_comes_back(capsys):
    baseline = EngineConfig("/models/tiny-agent", "tiny-agent", ("--max-model-len", "4096", *TOOL_FLAGS))
    lab = _lab(load_settings({}), baseline)
    with pytest.raises(RuntimeError, match="inside"):  # back to the baseline whatever happened in the block
        with thinking_model_served(lab) as model:
            assert model == "tiny-qwen3" and lab.engine.config().served_name == "tiny-qwen3"
            assert flag_value(lab.engine.config().args, "--reasoning-parser") == "qwen3"
            assert lab.engine.config().model.endswith("tiny-qwen3")
            raise RuntimeError("inside")
    assert len(lab.engine.applied) == 2 and lab.engine.applied[-1] == baseline
    assert "one restart now, and one back to tiny-agent" in capsys.readouterr().out


def test_on_a_cpu_the_stand_in_starts_beside_the_baseline_and_the_lab_points_back_after(monkeypatch, tmp_path,
                                                                                        capsys):
    from helpers.engine import session
    from helpers.engine.local import LocalEngine

    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(LocalEngine, "start", lambda self, config=None, timeout_s=None: calls.append(
        ("start", self.settings.port, config)))
    monkeypatch.setattr(LocalEngine, "stop", lambda self, timeout_s=None: calls.append(("stop", self.settings.port)))
    settings = load_settings({})
    baseline = LocalEngine(settings)
    client = object()
    lab = SimpleNamespace(settings=settings, engine=baseline, client=client, model="tiny-agent")
    with pytest.raises(RuntimeError, match="inside"):
        with thinking_model_served(lab) as model:
            assert model == "tiny-qwen3" and lab.engine is not baseline and lab.client is not client
            assert lab.settings.port == settings.port + session.THINKING_PORT_OFFSET
            assert lab.settings.base_url == f"http://127.0.0.1:{lab.settings.port}/v1"
            raise RuntimeError("inside")
    assert (lab.settings, lab.engine, lab.client) == (settings, baseline, client)  # back, whatever happened
    (_, port, config), stop = calls
    assert port == settings.port + session.THINKING_PORT_OFFSET and stop == ("stop", port)
    assert config.served_name == "tiny-qwen3" and flag_value(config.args, "--reasoning-parser") == "qwen3"
    assert flag_value(config.args, "--kv-cache-memory-bytes") == str(session.THINKING_KV_CACHE_BYTES)
    assert "beside tiny-agent (which keeps running): one start now" in capsys.readouterr().out


def test_on_a_cpu_a_traced_copy_of_the_baseline_starts_beside_it_once(monkeypatch, tmp_path, capsys):
    """Tracing on the CPU: one start of the baseline's configuration with the tracing flag and environment, on the port
    beside it (a quarter of the KV memory), stopped after; no restart of the baseline itself."""
    from helpers.engine import session
    from helpers.engine.local import LocalEngine
    from helpers.engine.trace_store import TRACES_FLAG, TRACING_ENV, with_tracing

    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(LocalEngine, "start", lambda self, config=None, timeout_s=None: calls.append(
        ("start", self.settings.port, self.settings.model, config)))
    monkeypatch.setattr(LocalEngine, "stop", lambda self, timeout_s=None: calls.append(("stop", self.settings.port)))
    monkeypatch.setattr(LocalEngine, "config", lambda self: EngineConfig(
        "/models/tiny-agent", "tiny-agent", ("--kv-cache-memory-bytes", str(1 << 30), *TOOL_FLAGS)))
    settings = load_settings({})
    baseline = LocalEngine(settings)
    lab = SimpleNamespace(settings=settings, engine=baseline, client=object(), model="tiny-agent")
    traced = with_tracing(baseline.config(), "http://127.0.0.1:6006/v1/traces")
    with session.served_for_the_block(lab, traced, "tiny-agent with tracing on"):
        assert lab.engine is not baseline and lab.settings.port == settings.port + session.THINKING_PORT_OFFSET
    assert lab.engine is baseline and lab.settings is settings
    (_, port, model, config), stop = calls
    assert model == "tiny-agent" and stop == ("stop", port)
    assert flag_value(config.args, TRACES_FLAG) == "http://127.0.0.1:6006/v1/traces"
    assert set(TRACING_ENV) <= set(config.env) and config.model == "/models/tiny-agent"
    assert flag_value(config.args, "--kv-cache-memory-bytes") == str(session.THINKING_KV_CACHE_BYTES)
    assert "beside tiny-agent (which keeps running): one start now" in capsys.readouterr().out


def test_elsewhere_a_configuration_for_the_block_is_a_restart_and_one_back_whatever_happened(capsys):
    from helpers.engine.session import served_for_the_block

    baseline = EngineConfig("/models/tiny-agent", "tiny-agent", TOOL_FLAGS)
    lab = _lab(load_settings({"WORKSHOP_PROFILE": "gpu"}), baseline)
    traced = replace(baseline, args=(*TOOL_FLAGS, "--otlp-traces-endpoint", "http://x/v1/traces"))
    with pytest.raises(RuntimeError, match="inside"):
        with served_for_the_block(lab, traced, "tiny-agent with tracing on"):
            assert lab.engine.config() == traced
            raise RuntimeError("inside")
    assert lab.engine.applied == [traced, baseline]
    assert "one restart now, and one back to tiny-agent" in capsys.readouterr().out


def test_a_cpu_engine_on_the_stand_in_already_is_not_restarted():
    config = EngineConfig("/models/tiny-qwen3", "tiny-qwen3", (*TOOL_FLAGS, "--reasoning-parser", "qwen3"))
    lab = _lab(load_settings({}), config)
    with thinking_model_served(lab):
        pass
    assert lab.engine.applied == []
    # the model without the parser is one restart, to add it
    lab = _lab(load_settings({}), replace(config, args=TOOL_FLAGS))
    with thinking_model_served(lab):
        assert flag_value(lab.engine.config().args, "--reasoning-parser") == "qwen3"
    assert len(lab.engine.applied) == 2


def test_an_endpoint_run_elsewhere_is_asked_as_it_is(capsys):
    lab = _lab(load_settings({"VLLM_HOST": "http://elsewhere:8000/v1", "WORKSHOP_PROFILE": "gpu"}),
               EngineConfig("some/model", "some/model"), reconfigurable=False)
    with thinking_model_served(lab) as model:
        assert model == "some/model"
    assert lab.engine.applied == [] and "set where it runs" in capsys.readouterr().out


def test_tracing_on_the_cluster_says_where_spans_go_and_restarts_nothing():
    from helpers.lessons.l01_connect import trace_agent_run

    baseline = EngineConfig("Qwen/Qwen3-4B", "Qwen/Qwen3-4B", TOOL_FLAGS)
    lab = _lab(K8S, baseline)  # a Kubernetes engine: reconfigurable, but in a pod of its own
    life, why = trace_agent_run(lab, "What's the weather in Paris?")
    assert life is None and lab.engine.applied == []  # no flag pointed at the notebook pod's 127.0.0.1
    assert "OTLP endpoint your instructor runs" in why and "Tracing on the cluster" in why
    life, why = trace_agent_run(lab, "What's the weather in Paris?", run=False)
    assert life is None and "RUN_GO_DEEPER is False" in why


def _thought(reasoning=None, calls=(), content=None, finish="stop", question="What's the weather in Paris?"):
    step = AgentStep(1, 0.1, 400, 60, tool_calls=list(calls), content=content, reasoning=reasoning,
                     reasoning_tokens=40 if reasoning else None, finish_reason=finish)
    return AgentRun(question, "answer", [step], [])


def _call(city):
    return {"name": "get_weather", "arguments": {"city": city}, "result": {"city": city, "temperature_c": 18}}


def test_a_reasoning_next_to_a_tool_call_is_shown_and_its_arguments_are_judged_as_they_came():
    right = conclude_thinking(_thought("The user asks about Paris.", [_call("Paris")]), "tiny-qwen3")
    assert right.verdict == SHOWN and 'called get_weather({"city": "Paris"})' in right.text
    assert "40 reasoning tokens of 60" in right.text and "they name what the question asked" in right.text
    wrong = conclude_thinking(_thought("The user asks about a city.", [_call("Lyon")]), "tiny-qwen3")
    assert wrong.verdict == SHOWN and "they do not match the question" in wrong.text


def test_no_reasoning_is_said_honestly_and_a_turn_cut_while_thinking_is_named():
    none = conclude_thinking(_thought(None, [_call("Paris")]), "Qwen/Qwen3-4B")
    assert none.verdict == NOT_SHOWN and "returned no reasoning: it did not think here" in none.text
    leaked = conclude_thinking(_thought(None, content="<think>hm</think> Sunny"), "tiny-qwen3")
    assert "without --reasoning-parser qwen3" in leaked.text
    cut = conclude_thinking(_thought("Let me think", finish="length"), "tiny-qwen3")
    assert cut.verdict == NOT_SHOWN and "ended inside the reasoning" in cut.text
    answered = conclude_thinking(_thought("Easy.", content="It is sunny."), "tiny-qwen3")
    assert answered.verdict == NOT_SHOWN and "answered without a tool call" in answered.text
