"""Against the real local engine: vLLM's CPU build serving the shipped tiny agent model (the notebooks' runs on it
are in tests/test_nb*_local.py).

The module works on the suite's shared engine (tests/conftest.py ``shared_engine``: its own port and state directory,
on the default configuration when the module begins); its tests change flags and models on it in turn.
"""

from __future__ import annotations

import os
import signal

import pytest

from helpers.evals.agent import run_agent
from helpers.engine.interface import EngineStartError
from helpers.core.vllm_args import flag_value
from helpers.engine.session import EndpointError

pytestmark = pytest.mark.engine
PORT = os.environ.get("WORKSHOP_TEST_PORT", "8765")  # another port lets two suites run side by side


@pytest.fixture(scope="module")
def lab(shared_engine):
    """The shared engine on PORT, this process's environment on its port and state directory for the module (the
    notebooks' kernels connect through it); the next test that uses it finds it back on the default configuration."""
    with shared_engine.use() as lab:
        yield lab


def test_ready_means_the_model_is_listed(lab):
    assert lab.check() == ["tiny-agent"]
    status = lab.engine.status()
    assert status["ready"] is True and status["endpoint"] == f"http://127.0.0.1:{PORT}/v1"


def test_tool_call_round_trip_parsed_by_vllm(lab):
    run = run_agent(lab, "What's the weather in Paris?")
    call = run.steps[0].tool_calls[0]
    assert call["name"] == "get_weather" and call["arguments"] == {"city": "Paris"}
    assert str(call["result"]["temperature_c"]) in run.answer


def test_plain_answer_when_no_tool_fits(lab):
    run = run_agent(lab, "thanks, that helped")
    assert not run.called_tools and run.answer


def test_a_flag_vllm_rejects_shows_the_log_and_rolls_back(lab):
    before = lab.engine.args()
    with pytest.raises(EngineStartError) as info:
        lab.engine.set_flag("--max-num-seqs", "banana")
    assert "invalid int value" in str(info.value)
    assert "back on the last good" in str(info.value)
    assert lab.engine.args() == before and flag_value(before, "--max-num-seqs") is None
    assert lab.engine.is_ready()


def test_planner_predicts_vllm_kv_capacity_to_the_token(lab):
    from helpers.lessons.l02_memory import compare_with_engine, predict_cpu_engine_kv
    from helpers.measure.server_metrics import scrape

    predicted = predict_cpu_engine_kv(lab.engine.config().model, lab.engine.args())
    reported = scrape(lab.settings.metrics_url).cache_config()
    assert reported["num_gpu_blocks"] == predicted.num_blocks
    assert reported["kv_cache_size_tokens"] == predicted.vllm_kv_cache_size_tokens
    table = compare_with_engine(predicted, reported)
    assert (table["predicted"] == table["vLLM reports"]).all()


def test_a_killed_engine_is_explained_and_restart_recovers(lab):
    os.killpg(lab.engine.pid, signal.SIGKILL)
    with pytest.raises(EndpointError, match="stopped answering.*restart"):
        lab.chat([{"role": "user", "content": "hi"}], max_tokens=4)
    lab.engine.restart()
    assert lab.chat([{"role": "user", "content": "hi"}], max_tokens=4).choices[0].message is not None


def test_eval_smoke_suite_runs_through_vllm_and_scores_every_category(lab, tmp_path):
    from helpers.evals import suite as evals

    run = evals.run_suite(lab, "smoke")
    summary = run.summary()
    assert list(summary.index) == [*evals.CATEGORIES, "all"] and summary.loc["all", "n"] == 10
    assert run.rows["error"].isna().all()  # every request accepted, structured outputs included
    assert summary.loc["tool_call", "pass_rate"] > 0
    json_rows = run.rows[run.rows["category"] == "json"]
    assert json_rows["parses"].all()  # structured outputs: the answer is JSON whatever the model
    loaded = evals.load_run(run.save(tmp_path / "smoke.json"))
    assert evals.compare(loaded, run).regressed == []
