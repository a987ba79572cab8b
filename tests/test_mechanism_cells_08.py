"""Notebook 08's mechanism cell, the keep-or-roll-back loop written out, against the helper that takes over from it
(``tune_one_flag_at_a_time``): the cell's source runs on its own against a fake engine and a fake measurement (plain
Python objects below, no vLLM), and both must take the same decisions, leave the same log and make the same restarts."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

import notebook_cells
from helpers.core.settings import load_settings
from helpers.core.vllm_args import EngineConfig, flag_value
from helpers.engine.interface import Engine, EngineStartError
from helpers.evals.suite import EvalRun, EvalSettings
from helpers.lab.notebooks import NOTEBOOK_DIR
from helpers.lessons import l08_tuning as l08

NOTEBOOK = NOTEBOOK_DIR / "08_tuning_and_evaluation.ipynb"
TOP = 8
SPEED, LATENCY = f"c{TOP}_output_tok_s", f"c{TOP}_p90_ttft_ms"
BASELINE_ARGS = ("--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30))


def mechanism_source() -> str:
    return notebook_cells.tagged(NOTEBOOK, "mechanism").source


class FakeEngine(Engine):
    """An engine that keeps its configuration in memory, records every restart, and refuses the flags in ``refuse``
    as vLLM would: the restart fails and the engine is back on its last good configuration."""

    def __init__(self, refuse: set[str] = frozenset()) -> None:
        super().__init__(load_settings({}))
        self._config = EngineConfig(model="tiny-agent", served_name="tiny-agent", args=BASELINE_ARGS)
        self.refuse, self.restarts = set(refuse), []

    def config(self) -> EngineConfig:
        return self._config

    def apply(self, config: EngineConfig, timeout_s: float | None = None) -> None:
        self.restarts.append(config.args)
        bad = [f for f in self.refuse if flag_value(config.args, f) is not None]
        if bad:
            raise EngineStartError(f"vLLM did not start: unrecognized arguments: {bad[0]}\nlog line two")
        self._config = config

    def logs(self, lines: int = 50) -> str:
        return ""

    def stop(self) -> None:
        pass


def eval_run(failing: int, n: int = 10) -> EvalRun:
    """An eval of ``n`` tasks whose first ``failing`` fail."""
    rows = pd.DataFrame({"id": [f"t{i}" for i in range(n)], "category": "tool_call",
                         "passed": [i >= failing for i in range(n)], "output": "", "error": None})
    return EvalRun("smoke", 1, "tiny-agent", "http://127.0.0.1", EvalSettings(), rows)


class FakeMeasure:
    """A scorecard row and an eval run computed from the engine's flags: each (flag, value) in ``effects`` scales
    the speed and the p90 TTFT, adds KV capacity and fails eval tasks when the engine runs with it."""

    def __init__(self, engine: FakeEngine, effects: dict[tuple[str, str], dict]) -> None:
        self.engine, self.effects, self.names = engine, effects, []

    def __call__(self, name: str):
        self.names.append(name)
        speed, latency, kv, failing = 100.0, 200.0, 10_000, 1
        for (flag, value), effect in self.effects.items():
            if flag_value(self.engine.args(), flag) == value:
                speed *= effect.get("speed_x", 1.0)
                latency *= effect.get("latency_x", 1.0)
                kv += effect.get("kv", 0)
                failing += effect.get("fails", 0)
        runs = [speed * 0.99, speed * 1.01]
        row = {"name": name, SPEED: sum(runs) / 2, f"{SPEED}_runs": runs, LATENCY: latency,
               f"{LATENCY}_runs": [latency, latency], "kv_capacity_tokens": kv, "all_pass_rate": 1 - failing / 10}
        return row, eval_run(failing)


def session(candidates, effects, refuse=frozenset()):
    """The inputs the notebook has when section 2 begins, on a fresh fake engine: a measured baseline and its rule."""
    engine = FakeEngine(refuse)
    measure = FakeMeasure(engine, effects)
    lab = SimpleNamespace(engine=engine, settings=engine.settings, model="tiny-agent")
    current, current_eval = measure("baseline")
    log = l08.TuningLog()
    log.record("baseline", current, None)
    rule = l08.relative_rule(current, SPEED, LATENCY, 0.03, 1.5)
    return dict(lab=lab, measure=measure, current=current, current_eval=current_eval, rule=rule, log=log,
                baseline_config=engine.config(), core_candidates=candidates)


def run_cell(inputs: dict) -> dict:
    namespace = {**inputs, "baseline_restored": l08.baseline_restored, "cluster_model": l08.cluster_model,
                 "check_quiet": l08.check_quiet}
    exec(compile(mechanism_source(), "08 mechanism cell", "exec"), namespace)  # noqa: S102 - the shipped cell
    return namespace


def run_helper(inputs: dict) -> l08.TuningRun:
    lab = inputs["lab"]
    with l08.baseline_restored(lab.engine, inputs["baseline_config"]):  # as the notebook's Go deeper cell runs it
        return l08.tune_one_flag_at_a_time(lab, inputs["core_candidates"], inputs["measure"], inputs["current"],
                                           inputs["current_eval"], inputs["rule"], inputs["log"],
                                           model=l08.cluster_model(lab.settings))


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """No machine sampling (a second per step): the loop's quiet check says the machine is quiet."""
    quiet = SimpleNamespace(message=lambda: "machine quiet")
    monkeypatch.setattr(l08, "check_quiet", lambda lab=None: quiet)


MIXED = ([("--kv-cache-memory-bytes", 2 << 30), ("--max-num-seqs", 32), ("--kv-cache-dtype", "fp8"),
          ("--max-num-batched-tokens", 512)],
         {("--kv-cache-memory-bytes", str(2 << 30)): {"kv": 10_000},           # same speed, more KV: kept
          ("--max-num-seqs", "32"): {"speed_x": 1.3, "latency_x": 1.2},        # faster within the SLO: kept
          ("--kv-cache-dtype", "fp8"): {"speed_x": 1.2, "fails": 8},           # faster, the eval regresses: rolled back
          ("--max-num-batched-tokens", "512"): {"speed_x": 0.95}})             # no faster: rolled back
ALL_ROLLED_BACK = ([("--max-num-seqs", 64), ("--enable-magic", True), ("--max-model-len", 2048),
                    ("--kv-cache-dtype", "fp8")],
                   {("--max-num-seqs", "64"): {"speed_x": 1.5, "latency_x": 2.0},  # faster, breaks the SLO
                    ("--max-model-len", "2048"): {"speed_x": 0.8},                 # slower beyond the noise
                    ("--kv-cache-dtype", "fp8"): {"speed_x": 1.01}},               # within the noise, no more KV
                   {"--enable-magic"})                                             # vLLM refuses it


def _outcome(inputs: dict) -> dict:
    frame = inputs["log"].frame()
    return {"steps": frame[["step", "change", "kept", "why"]].to_dict(orient="records"),
            "restarts": list(inputs["lab"].engine.restarts), "measured": list(inputs["measure"].names),
            "end": inputs["lab"].engine.config()}


@pytest.mark.parametrize("case", [MIXED, ALL_ROLLED_BACK], ids=["mixed", "every-candidate-rolled-back-one-refused"])
def test_the_cell_decides_as_tune_one_flag_at_a_time(case, capsys):
    candidates, effects, *refuse = case
    refuse = refuse[0] if refuse else frozenset()
    cell = session(candidates, effects, refuse)
    namespace = run_cell(cell)
    cell_printed = capsys.readouterr().out
    helper = session(candidates, effects, refuse)
    tuned = run_helper(helper)
    helper_printed = capsys.readouterr().out
    assert _outcome(cell) == _outcome(helper)
    assert namespace["final"] == tuned.final and namespace["current"] == tuned.current
    assert [c.flag for c in namespace["changes"]] == [c.flag for c in tuned.changes]
    assert [c.patch_yaml for c in namespace["changes"]] == [c.patch_yaml for c in tuned.changes]
    keep_lines = [line for line in cell_printed.splitlines() if line.startswith(("KEEP", "ROLLBACK"))]
    assert keep_lines == [line for line in helper_printed.splitlines() if line.startswith(("KEEP", "ROLLBACK"))]
    assert l08.same_configuration(cell["lab"].engine.config(), cell["baseline_config"])  # it ends on the baseline


def test_the_cases_cover_what_they_claim():
    """The mixed case keeps some and rolls back some; the edge case keeps none and one candidate is refused."""
    mixed = session(*MIXED)
    run_cell(mixed)
    kept = [s["kept"] for s in mixed["log"].steps[1:]]
    assert kept == [True, True, False, False]
    assert "eval regressed" in mixed["log"].steps[3]["why"]
    edge = session(*ALL_ROLLED_BACK)
    namespace = run_cell(edge)
    steps = edge["log"].steps[1:]
    assert [s["kept"] for s in steps] == [False] * 4 and "breaks the" in steps[0]["why"]
    assert steps[1]["why"] == "vLLM refused it: vLLM did not start: unrecognized arguments: --enable-magic"
    # each candidate: one restart from the kept configuration (the refused one: the failed restart), which also sets
    # the one rolled back before it back; one at the end, back to the baseline; none of a roll-back's own
    assert l08.same_configuration(namespace["final"], edge["baseline_config"]) and len(edge["lab"].engine.restarts) == 5
    assert [flag_value(args, "--max-num-seqs") for args in edge["lab"].engine.restarts] == ["64", None, None, None, None]
    assert edge["measure"].names[1:] == [
        "--max-num-seqs (default) -> 64", "--max-model-len 4096 -> 2048", "--kv-cache-dtype (default) -> fp8"]


def test_the_cell_writes_the_loop_out_without_the_helper():
    source = mechanism_source()
    assert 10 <= len(source.strip().splitlines()) <= 25
    assert "tune_one_flag_at_a_time(" not in source.replace("# The keep-or-roll-back loop", "")
    assert "import" in source and "tune_one_flag_at_a_time" not in source.split("\n", 2)[1]  # the import line


def test_a_candidate_list_in_the_cell_can_be_changed_by_the_learner():
    """The cell reads its candidates from core_candidates: another list runs another loop."""
    inputs = session([("--max-num-seqs", 32)], MIXED[1])
    run_cell(inputs)
    assert [s["change"] for s in inputs["log"].steps] == ["baseline", "--max-num-seqs (default) -> 32"]
    assert l08.same_configuration(inputs["lab"].engine.config(), inputs["baseline_config"])
