"""Issue 42 parts 4 to 6: a core path that stands alone, a prediction before its measurement with nothing above it
giving the answer, and a hint only after a wrong attempt. Static checks of the committed notebooks (no engine); the
cluster-path suite runs each notebook's core path alone and checks its outputs the same way."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import nbformat
import pytest

from helpers.core.lesson import check_exercise, show_solution
from helpers.lab.answers import answer_problems, checks, normal
from helpers.lab.notebooks import NOTEBOOK_DIR, core_path, undefined_names, workshop_notebooks

NOTEBOOKS = workshop_notebooks()
LESSONS = {"01": "helpers.lessons.l01_connect", "02": "helpers.lessons.l02_memory", "03": "helpers.lessons.l03",
           "04": "helpers.lessons.l04_moe", "05": "helpers.lessons.l05_quantization", "06": "helpers.lessons.l06",
           "07": "helpers.lessons.l07_saturation", "08": "helpers.lessons.l08_tuning"}


def _nb(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _helpers_strings() -> str:
    """The text of every string in the helpers package, adjacent literals joined as Python joins them, the lessons'
    ANSWERS tables left out: a phrase must be found where a helper says it, not only where it is listed."""
    texts = []
    for file in sorted(Path(inspect.getfile(importlib.import_module("helpers"))).parent.rglob("*.py")):
        for node in ast.parse(file.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and "ANSWERS" in {
                    getattr(t, "id", "") for t in (node.targets if isinstance(node, ast.Assign) else [node.target])}:
                continue
            texts += [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return "\n".join(texts)


def _md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text)


def _code(text: str, *tags: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(text, metadata={"tags": list(tags)} if tags else {})


def _planted(*cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


# ---------------------------------------------------------------- a hint after a wrong attempt, never before

def test_no_hint_before_an_attempt_and_the_hint_after_a_wrong_one(capsys):
    def check(answer):
        return None if answer == 42 else f"{answer} is not it."

    result = check_exercise("the answer", None, check, "SIX TIMES SEVEN")
    assert not result.answered and "SIX TIMES SEVEN" not in capsys.readouterr().out
    with pytest.raises(AssertionError) as wrong:
        check_exercise("the answer", 41, check, "SIX TIMES SEVEN")
    assert str(wrong.value).endswith("Hint: SIX TIMES SEVEN")
    assert check_exercise("the answer", 42, check, "SIX TIMES SEVEN").answered


def test_a_solution_is_checked_and_marks_nothing_right(capsys):
    def check(answer):
        return None if answer == 42 else "wrong."

    shown = show_solution("the answer", 42, check, "six times seven is 42")
    assert shown.value == 42 and "right" not in capsys.readouterr().out
    with pytest.raises(AssertionError):  # a wrong worked solution fails where it is written
        show_solution("the answer", 41, check)


def _assigned(source: str) -> set[str]:
    tree = ast.parse(source)
    return {t.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for t in ast.walk(target) if isinstance(t, ast.Name)}


def _calls(source: str) -> set[str]:
    return {getattr(n.func, "id", getattr(n.func, "attr", "")) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call)}


def solution_problems(nb: nbformat.NotebookNode) -> list[str]:
    """A sentence per solution cell that would overwrite the learner's answer or mark it right on "Run All"."""
    problems, exercise = [], None
    for index, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if "exercise" in tags:
            exercise = cell
        if "solution" not in tags:
            continue
        if exercise is None:
            problems.append(f"cell {index}: a solution with no exercise cell above it")
            continue
        clash = _assigned(cell.source) & _assigned(exercise.source)
        if clash:
            problems.append(f"cell {index}: the solution assigns {sorted(clash)}, the learner's own answer")
        if "check_exercise" in _calls(cell.source) or "show_solution" not in _calls(cell.source):
            problems.append(f"cell {index}: a solution calls show_solution, not check_exercise (which marks right)")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_solutions_leave_the_learners_answer_alone(path):
    nb = _nb(path)
    assert any("solution" in c.get("metadata", {}).get("tags", []) for c in nb.cells) or path.stem[:2] in {"02"}
    assert solution_problems(nb) == []


def test_the_solution_rule_fails_on_a_solution_that_overwrites_the_answer():
    nb = _planted(_code("my_x = None\ncheck_exercise('x', my_x, check, HINT)", "exercise"),
                  _code("my_x = 42\ncheck_exercise('x', my_x, check, HINT)", "solution"))
    assert len(solution_problems(nb)) == 2
    nb.cells[1] = _code("solution_x = 42\nshow_solution('x', solution_x, check)", "solution")
    assert solution_problems(nb) == []


# ---------------------------------------------------------------- a core path that stands alone

@pytest.mark.parametrize("path", NOTEBOOKS + [NOTEBOOK_DIR / "start_here.ipynb"], ids=lambda p: p.stem[:2])
def test_the_core_path_reads_only_what_the_core_path_defines(path):
    assert undefined_names(core_path(_nb(path))) == []


def test_the_core_path_rule_fails_on_a_last_cell_that_reads_go_deeper():
    nb = _planted(_md("## 1. Core"), _code("x = 1"), _md("## Go deeper: more"), _code("y = x + 1"),
                  _md("## What we learned"), _code("print(x, y)"))
    assert [c.source for c in core_path(nb).cells] == ["## 1. Core", "x = 1", "## What we learned", "print(x, y)"]
    [problem] = undefined_names(core_path(nb))
    assert "'y'" in problem and undefined_names(nb) == []


# ---------------------------------------------------------------- predict, then measure; no answer above its check

def prediction_problems(nb: nbformat.NotebookNode, answers: dict) -> list[str]:
    """Why a core path does not predict before it measures: no prediction on it (one in Go deeper does not count),
    or one whose answer is not listed (so nothing checks that no cell above gives it away)."""
    core = [c for c in checks(nb) if c.core and c.kind == "prediction"]
    if not core:
        return ["no prediction on the core path"]
    return [f"{c.heading!r}: its answer is not in ANSWERS" for c in core if not answers.get(c.heading)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_the_core_path_predicts_before_it_measures(path):
    """At least one prediction on the core path, with its answers hidden above it (test_no_answer_is_visible_...)."""
    assert prediction_problems(_nb(path), importlib.import_module(LESSONS[path.stem[:2]]).ANSWERS) == []


def test_the_prediction_rule_fails_on_a_core_path_whose_prediction_is_in_go_deeper():
    nb = _planted(_md("## 1. Measure"), _code("x = measure()"), _md("## Go deeper: more"),
                  _md("### Exercise 1: guess"), _code("MY_PREDICTION = None\ncheck(MY_PREDICTION)"),
                  _md("## What we learned"), _code("print(x)"))
    assert prediction_problems(nb, {"Exercise 1: guess": ("the answer is here",)}) == ["no prediction on the core path"]
    nb.cells.insert(2, nb.cells.pop(3))  # the prediction's heading and cell move before Go deeper
    nb.cells.insert(3, nb.cells.pop(4))
    assert prediction_problems(nb, {}) == ["'Exercise 1: guess': its answer is not in ANSWERS"]
    assert prediction_problems(nb, {"Exercise 1: guess": ("the answer is here",)}) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_no_answer_is_visible_above_its_check(path):
    module = importlib.import_module(LESSONS[path.stem[:2]])
    nb = _nb(path)
    assert answer_problems(nb, module.ANSWERS) == []
    # each phrase is real answer text: in the helpers' strings, or in a cell at or below its check (a number
    # the run computes is checked on the cluster path's executed copies instead)
    source = normal(_helpers_strings())
    where = {c.heading: c.index for c in checks(nb)}
    for title, phrases in module.ANSWERS.items():
        below = normal("\n".join(c.source for c in nb.cells[where.get(title, 0):]))
        assert [p for p in phrases if normal(p) not in source and normal(p) not in below
                and not re.search(r"\d", p)] == [], title


def test_the_answer_rule_fails_on_an_answer_shown_above_its_check():
    nb = _planted(_md("## 1. Measure"), _code("print('prefill grows about 4x')"),
                  _md("### Exercise 1: double it"), _code("MY_PREDICTION = None\ncheck(MY_PREDICTION)"),
                  _md("## What we learned"))
    answers = {"Exercise 1: double it": ("grows about 4x",)}
    [problem] = answer_problems(nb, answers)
    assert "visible above it" in problem and "cell 1" in problem
    nb.cells[1] = _code("print('done')")
    assert answer_problems(nb, answers) == []
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="Prefill GROWS about\n4x here")]  # shown, not written
    assert answer_problems(nb, answers) == [] and len(answer_problems(nb, answers, outputs=True)) == 1
    assert len(answer_problems(nb, {})) == 1  # a core check with no entry
    assert len(answer_problems(nb, {**answers, "Exercise 9": ("a b c",)})) == 1  # an entry with no check
    assert len(answer_problems(nb, {"Exercise 1: double it": ("fewer",)})) == 1  # too common to be an answer
