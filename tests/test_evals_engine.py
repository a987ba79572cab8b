"""The smoke eval suite against the real local engine (vLLM's CPU build serving the tiny agent).

Its own engine on its own port and state directory, started for the module and stopped after.
"""

from __future__ import annotations

import os

import pytest

from helpers import evals
from helpers.session import connect
from helpers.settings import CONTRACT_VARIABLES, load_settings

pytestmark = pytest.mark.engine
PORT = "8766"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    saved = dict(os.environ)
    for name in CONTRACT_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(WORKSHOP_PORT=PORT, WORKSHOP_STATE_DIR=str(tmp_path_factory.mktemp("eval-engine-state")))
    lab = connect(load_settings())
    yield lab
    lab.engine.stop()
    os.environ.clear()
    os.environ.update(saved)


def test_smoke_suite_runs_through_vllm_and_scores_every_category(lab, tmp_path):
    run = evals.run_suite(lab, "smoke")
    summary = run.summary()
    assert list(summary.index) == [*evals.CATEGORIES, "all"] and summary.loc["all", "n"] == 10
    assert run.rows["error"].isna().all()  # every request accepted, structured outputs included
    assert summary.loc["tool_call", "pass_rate"] > 0
    json_rows = run.rows[run.rows["category"] == "json"]
    assert json_rows["parses"].all()  # structured outputs: the answer is JSON whatever the model
    loaded = evals.load_run(run.save(tmp_path / "smoke.json"))
    assert evals.compare(loaded, run).regressed == []
