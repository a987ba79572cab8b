"""The code exercises of notebooks 06 (tokens per step, E for a and k) and 07 (Little's law on this run's numbers): the
learner's cell (tag ``exercise``) asks without failing while the answer is None, the worked solution (tag
``solution``, collapsed) passes, and a wrong answer fails with a sentence that says what is wrong. The cells' own
source runs here on plain numbers (no engine)."""

from __future__ import annotations

import nbformat
import pytest

import notebook_cells
from helpers.core.lesson import NO_ATTEMPT
from helpers.lab.notebooks import NOTEBOOK_DIR

NB06 = NOTEBOOK_DIR / "06_speculative_decoding.ipynb"
NB07 = NOTEBOOK_DIR / "07_saturation.ipynb"


def tagged(notebook, tag: str) -> nbformat.NotebookNode:
    return notebook_cells.tagged(notebook, tag)


def run(source: str, **names) -> dict:
    return notebook_cells.run_cells(source, **names)


def answered(source: str, name: str, answer: str) -> str:
    lines = source.splitlines()
    [i] = [i for i, line in enumerate(lines) if line.startswith(f"{name} = None")]
    lines[i] = f"{name} = {answer}"
    return "\n".join(lines)


# ---------------------------------------------------------------- 06: tokens per step

N06 = {"EXERCISE_A": 0.7, "NUM_SPECULATIVE_TOKENS": 3}


def test_06_asks_before_it_is_written_and_shows_no_hint_yet(capsys):
    run(tagged(NB06, "exercise").source, **N06)
    out = capsys.readouterr().out
    assert out.startswith("Your turn (tokens per step): ") and NO_ATTEMPT in out
    assert "Hint" not in out and "a^k" not in out  # the hint comes after a wrong attempt, never before one


def test_06_the_worked_solution_passes_and_leaves_the_learners_answer_alone(capsys):
    cell = tagged(NB06, "solution")
    assert cell.metadata["jupyter"]["source_hidden"] is True
    names = run(tagged(NB06, "exercise").source + "\n\n" + cell.source, **N06)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("The worked solution (tokens per step): E = 2.533 tokens per step at a = 0.7, k = 3; every guess "
                       "kept would give 4.")
    assert names["my_tokens_per_step"] is None and "✔" not in "\n".join(out)  # not overwritten, not marked right
    assert names["solution_tokens_per_step"] == pytest.approx(2.533, abs=1e-3)


@pytest.mark.parametrize("answer, says", [
    ("(1 - EXERCISE_A ** NUM_SPECULATIVE_TOKENS) / (1 - EXERCISE_A)", "is not (1 - a^(k+1)) / (1 - a) for a = 0.7, k = 3"),
    ("EXERCISE_A + EXERCISE_A ** 2 + EXERCISE_A ** 3", "counts the guesses kept only"),
    ("NUM_SPECULATIVE_TOKENS + 2", "no step yields more than k + 1 = 4 tokens"),
    ("EXERCISE_A", "at least one token"),
    ("'2.5'", "is not (1 - a^(k+1))"),
])
def test_06_a_wrong_answer_fails_saying_what_is_wrong(answer, says):
    with pytest.raises(AssertionError, match=r"tokens per step: .*" + says.replace("(", r"\(").replace(")", r"\)")
                       .replace("^", r"\^").replace("+", r"\+")):
        run(answered(tagged(NB06, "exercise").source, "my_tokens_per_step", answer), **N06)


def test_06_the_right_answer_written_any_way_passes(capsys):
    run(answered(tagged(NB06, "exercise").source, "my_tokens_per_step", "1 + 0.7 + 0.7 ** 2 + 0.7 ** 3"), **N06)
    assert "✔ tokens per step: right." in capsys.readouterr().out


# ---------------------------------------------------------------- 07: Little's law

def n07() -> dict:
    from helpers.lessons.l07_saturation import check_exercise, littles_law_check

    runs = {"top run": {"request_throughput": 2.5, "mean_e2el_ms": 12_400.0}}  # 2.5 req/s, 12.4 s each: 31 in flight
    return {"summarize": lambda result: runs[result], "small_results": ["c1 run", "top run"], "top": 32,
            "check_exercise": check_exercise, "littles_law_check": littles_law_check}


def test_07_asks_before_it_is_written_and_shows_no_hint_yet(capsys):
    run(tagged(NB07, "exercise").source, **n07())
    out = capsys.readouterr().out
    assert out.startswith("Your turn (Little's law): ") and NO_ATTEMPT in out
    assert "Hint" not in out and "X W" not in out  # the hint comes after a wrong attempt, never before one


def test_07_the_worked_solution_passes_on_this_runs_numbers_and_leaves_the_learners_answer_alone(capsys):
    cell = tagged(NB07, "solution")
    assert cell.metadata["jupyter"]["source_hidden"] is True
    names = run(tagged(NB07, "exercise").source + "\n\n" + cell.source, **n07())
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith(
        "The worked solution (Little's law): 2.50 req/s x 12.40 s = 31.0 requests in flight, against the 32 users")
    assert names["my_requests_in_flight"] is None and "✔" not in out  # not overwritten, not marked right
    assert names["solution_requests_in_flight"] == pytest.approx(31.0)


def test_07_a_wrong_answer_shows_the_hint():
    with pytest.raises(AssertionError, match=r"Hint: L = X W"):
        run(answered(tagged(NB07, "exercise").source, "my_requests_in_flight", "top"), **n07())


@pytest.mark.parametrize("answer, says", [("throughput_req_s / latency_s", "divides throughput by latency"),
                                          ("latency_s / throughput_req_s", "divides latency by throughput"),
                                          ("top", "32 is the concurrency the load generator was set to"),
                                          ("throughput_req_s + latency_s", "is not throughput_req_s x latency_s"),
                                          ("'many'", "must be a number of requests")])
def test_07_a_wrong_answer_fails_saying_what_is_wrong(answer, says):
    with pytest.raises(AssertionError, match=f"Little's law: .*{says}"):
        run(answered(tagged(NB07, "exercise").source, "my_requests_in_flight", answer), **n07())
