"""Notebook 08's code exercise, the SLO check: the learner's cell (tag ``exercise``) asks without failing while the
answer is None, the worked solution (tag ``solution``, collapsed) passes, and wrong answers fail with a sentence that
says what is wrong. The cells' own source runs here, on a scorecard and rule built from plain numbers."""

from __future__ import annotations

import nbformat
import pandas as pd
import pytest

import notebook_cells
from helpers.core.lesson import NO_ATTEMPT
from helpers.lab.notebooks import NOTEBOOK_DIR
from helpers.lessons import l08_tuning as l08

NOTEBOOK = NOTEBOOK_DIR / "08_tuning_and_evaluation.ipynb"


def tagged(tag: str) -> nbformat.NotebookNode:
    return notebook_cells.tagged(NOTEBOOK, tag)


def run(source: str, **names) -> dict:
    baseline = {"change": "baseline", "c8_output_tok_s": 100.0, "c8_p90_ttft_ms": 200.0}
    steps = [{"change": "--kv-cache-memory-bytes 1 -> 2", "c8_output_tok_s": 101.0, "c8_p90_ttft_ms": 280.0},
             {"change": "--max-num-seqs (default) -> 64", "c8_output_tok_s": 150.0, "c8_p90_ttft_ms": 420.0},
             {"change": "--enable-magic (default) -> True"}]  # refused by vLLM: nothing measured
    namespace = {"scorecard": pd.DataFrame([baseline, *steps]),
                 "rule": l08.relative_rule(baseline, "c8_output_tok_s", "c8_p90_ttft_ms", 0.03, 1.5), **names}
    exec(compile(source, "08 exercise", "exec"), namespace)  # noqa: S102 - the shipped cells
    return namespace


def test_the_exercise_asks_and_does_not_fail_before_it_is_written_and_shows_no_hint_yet(capsys):
    run(tagged("exercise").source)
    out = capsys.readouterr().out
    assert out.startswith("Your turn (the SLO check): ") and NO_ATTEMPT in out
    assert l08.SLO_HINT not in out and "Hint" not in out  # the hint comes after a wrong attempt, never before one


def test_the_worked_solution_passes_says_what_this_run_saw_and_leaves_the_learners_answer_alone(capsys):
    cell = tagged("solution")
    assert cell.metadata["jupyter"]["source_hidden"] is True  # collapsed in JupyterLab
    names = run(tagged("exercise").source + "\n\n" + cell.source)  # the exercise first, as a top-to-bottom run has it
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (
        "The worked solution (the SLO check): On this run the limit is 300 ms (1.5x the baseline's): "
        "--kv-cache-memory-bytes 1 -> 2: 280 ms, holds; --max-num-seqs (default) -> 64: 420 ms, breaks; "
        "--enable-magic (default) -> True: no measurement (the engine refused it).")
    assert names["my_slo_holds"] is None and "✔" not in out  # not overwritten, not marked right
    assert names["solution_slo_holds"](150, 100, 1.5) and not names["solution_slo_holds"](151, 100, 1.5)


def _answer_cell(answer: str) -> str:
    """The exercise cell with the learner's line written."""
    source = tagged("exercise").source
    line = next(line for line in source.splitlines() if line.startswith("my_slo_holds = None"))
    return source.replace(line, answer)


@pytest.mark.parametrize("answer, says", [
    ("my_slo_holds = lambda candidate_ms, baseline_ms, slo_x: candidate_ms < slo_x * baseline_ms",
     "a p90 TTFT of 150 ms against a baseline of 100 ms with slo_x=1.5 holds the SLO (limit 150 ms), but yours says False."),
    ("my_slo_holds = lambda candidate_ms, baseline_ms, slo_x: candidate_ms <= 1.5 * baseline_ms",  # slo_x ignored
     "with slo_x=1.2 breaks the SLO (limit 120 ms), but yours says True."),
    ("my_slo_holds = lambda candidate_ms, baseline_ms, slo_x: baseline_ms <= slo_x * candidate_ms",  # the wrong way round
     "a p90 TTFT of 151 ms against a baseline of 100 ms with slo_x=1.5 breaks the SLO"),
    ("my_slo_holds = lambda candidate_ms, baseline_ms, slo_x: slo_x * baseline_ms - candidate_ms",  # a number, not a bool
     "returned 50.0: return True or False."),
    ("my_slo_holds = 1.5", "my_slo_holds should be a function of (candidate_ms, baseline_ms, slo_x), not float."),
    ("my_slo_holds = lambda candidate_ms, baseline_ms: candidate_ms <= 1.5 * baseline_ms",
     "my_slo_holds(100, 100, 1.5) raised TypeError"),
])
def test_a_wrong_answer_fails_with_what_is_wrong_and_the_hint(answer, says):
    with pytest.raises(AssertionError) as info:
        run(_answer_cell(answer))
    message = str(info.value)
    assert message.startswith("the SLO check: ") and says in message and message.endswith("Hint: " + l08.SLO_HINT)


def test_the_exercise_agrees_with_the_rule_decide_applies():
    """The reference the check uses is decide's own SLO test: a candidate at the limit passes, one past it breaks."""
    baseline = {"tok_s": [100.0, 100.0], "tok_s_runs": [100.0, 100.0], "p90": 200.0}
    rule = l08.relative_rule({"tok_s": 100.0, "p90": 200.0}, "tok_s", "p90", slo_x=1.5)
    at_limit = l08.decide(baseline, {"tok_s": 150.0, "p90": 300.0}, rule)
    past = l08.decide(baseline, {"tok_s": 150.0, "p90": 300.5}, rule)
    assert at_limit.keep and not past.keep and any("SLO" in r for r in past.reasons)
    assert l08.slo_check_problem(lambda c, b, x: c <= x * b) is None
