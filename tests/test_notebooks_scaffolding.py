"""Every notebook teaches in the same shape: objectives, time and prerequisites at the top; a "what you
should see" check in each numbered section; two or three "try it yourself" exercises that ask for a
prediction and check it; a summary and the next notebook; short code cells (the work lives in helpers/)."""

import re
import statistics

import nbformat
import pytest

from helpers.lab.notebooks import NOTEBOOK_DIR, parameters_cell_index, workshop_notebooks

NOTEBOOKS = workshop_notebooks()
MEDIAN_CODE_LINES = 8


def sections(nb: nbformat.NotebookNode) -> list[tuple[str, list[nbformat.NotebookNode]]]:
    """(heading, cells up to the next heading of level 2 or 3) in order; the title cell opens the first."""
    out: list[tuple[str, list]] = []
    for cell in nb.cells:
        heading = re.match(r"#{1,3} .*", cell.source) if cell.cell_type == "markdown" else None
        if heading:
            out.append((heading.group(0), [cell]))
        elif out:
            out[-1][1].append(cell)
    return out


def code_of(cells) -> str:
    return "\n".join(c.source for c in cells if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_top_states_objectives_time_and_prerequisites(path):
    top = nbformat.read(path, as_version=4).cells[0].source
    assert "**Objectives" in top, f"{path.name}: no objectives at the top"
    objectives = top.split("**Objectives", 1)[1].split("**Time", 1)[0]
    assert len(re.findall(r"^- ", objectives, re.M)) >= 2, f"{path.name}: fewer than two objectives"
    assert "**Time:**" in top and "**Prerequisites:**" in top, f"{path.name}: time or prerequisites missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_numbered_section_checks_what_you_should_see(path):
    numbered = [(h, cells) for h, cells in sections(nbformat.read(path, as_version=4)) if re.match(r"## \d+\.", h)]
    assert numbered, f"{path.name}: no numbered sections"
    missing = [h for h, cells in numbered if code_of(cells)
               and not any(check in code_of(cells) for check in ("should_see", "show_conclusions"))]
    assert not missing, f"{path.name}: sections without a 'what you should see' check: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_try_it_yourself_has_two_or_three_exercises_that_check_a_prediction(path):
    nb = nbformat.read(path, as_version=4)
    headings = [h for h, _ in sections(nb)]
    assert "## Try it yourself" in headings, f"{path.name}: no '## Try it yourself' section"
    exercises = [(h, cells) for h, cells in sections(nb) if h.startswith("### Exercise")]
    assert 2 <= len(exercises) <= 3, f"{path.name}: {len(exercises)} exercises"
    for heading, cells in exercises:
        code = code_of(cells)
        assert re.search(r"^MY_PREDICTION = None\b", code, re.M) and "check_prediction(" in code, \
            f"{path.name}, {heading}: the exercise must ask for MY_PREDICTION and check it"
        assert "predict" in cells[0].source.lower(), f"{path.name}, {heading}: ask for the prediction in words"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_summary_and_the_next_step_end_the_notebook(path):
    nb = nbformat.read(path, as_version=4)
    last_markdown = [c for c in nb.cells if c.cell_type == "markdown"][-1].source
    assert last_markdown.startswith("## What we learned"), f"{path.name}: the summary is not last"
    link = re.search(r"\*\*Next:\*\*.*?\]\(([^)]+)\)", last_markdown, re.S)
    assert link, f"{path.name}: no '**Next:**' link in the summary"
    assert (NOTEBOOK_DIR / link.group(1)).exists(), f"{path.name}: the next link {link.group(1)} goes nowhere"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_cells_are_short(path):
    lines = [len(c.source.strip().splitlines()) for c in nbformat.read(path, as_version=4).cells
             if c.cell_type == "code"]
    assert statistics.median(lines) <= MEDIAN_CODE_LINES, \
        f"{path.name}: median code cell {statistics.median(lines)} lines; move code into helpers/"


# "section N" / "exercise N" in a comment of the parameters cell ("sections 5 and 6" names both)
POINTER = re.compile(r"\b(section|exercise)s?\s+(\d+(?:\s*(?:,|and)\s*\d+)*)", re.I)


def numbered_parts(nb: nbformat.NotebookNode) -> dict[str, str]:
    """'section N' (heading '## N.') and 'exercise N' (heading '### Exercise N') -> the text of their cells."""
    out = {}
    for heading, cells in sections(nb):
        found = re.match(r"## (\d+)\.|### Exercise (\d+)\b", heading)
        if found:
            key = f"section {found.group(1)}" if found.group(1) else f"exercise {found.group(2)}"
            out[key] = "\n".join(c.source for c in cells)
    return out


def wrong_pointers(nb: nbformat.NotebookNode) -> list[str]:
    """Each parameters-cell comment naming a section or exercise the notebook lacks, or one that never uses the
    parameter assigned on that line."""
    parts, wrong = numbered_parts(nb), []
    for line in nb.cells[parameters_cell_index(nb)].source.splitlines():
        code, _, comment = line.partition("#")
        names = re.findall(r"\b[A-Z][A-Z0-9_]*\b", code.split("=")[0]) if "=" in code else []
        for kind, numbers in POINTER.findall(comment):
            for part in (f"{kind.lower()} {n}" for n in re.findall(r"\d+", numbers)):
                if part not in parts:
                    wrong.append(f"{line.strip()!r}: the notebook has no {part}")
                else:
                    wrong += [f"{line.strip()!r}: {part} never uses {name}"
                              for name in names if name not in parts[part]]
    return wrong


def test_the_pointer_check_catches_a_wrong_section():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("X = 1  # section 2\nY = 2  # sections 1 and 2\nZ = 3  # section 1",
                                  metadata={"tags": ["parameters"]}),
        nbformat.v4.new_markdown_cell("## 1. One"), nbformat.v4.new_code_cell("print(Z)"),
        nbformat.v4.new_markdown_cell("### Exercise 1: one"), nbformat.v4.new_code_cell("print(X, Y)")])
    assert wrong_pointers(nb) == ["'X = 1  # section 2': the notebook has no section 2",
                                  "'Y = 2  # sections 1 and 2': section 1 never uses Y",
                                  "'Y = 2  # sections 1 and 2': the notebook has no section 2"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_parameters_cell_points_to_sections_that_exist_and_use_the_parameter(path):
    assert wrong_pointers(nbformat.read(path, as_version=4)) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_make_target_a_notebook_names_is_in_the_makefile(path):
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", (NOTEBOOK_DIR.parent / "Makefile").read_text(), re.M))
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    named = set(re.findall(r"`make ([A-Za-z][\w-]*)", text))
    assert named <= targets, f"{path.name}: no Makefile target {sorted(named - targets)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_code_exercise_is_followed_by_its_collapsed_worked_solution(path):
    cells = nbformat.read(path, as_version=4).cells
    tags = [c.metadata.get("tags", []) for c in cells]
    for i, cell_tags in enumerate(tags):
        if "exercise" in cell_tags:
            assert i + 1 < len(cells) and "solution" in tags[i + 1], f"{path.name}: cell {i}'s exercise has no solution after it"
            assert cells[i + 1].metadata.get("jupyter", {}).get("source_hidden") is True, \
                f"{path.name}: cell {i + 1}'s solution is not collapsed (metadata jupyter.source_hidden)"
        if "solution" in cell_tags:
            assert i and "exercise" in tags[i - 1], f"{path.name}: cell {i}'s solution follows no exercise"
    if path.name != "start_here.ipynb":  # issue 27: at least one code exercise per workshop notebook
        assert any("exercise" in t for t in tags), f"{path.name}: no code exercise (a cell tagged 'exercise')"
