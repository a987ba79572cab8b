"""Every notebook teaches in the same shape: objectives, time and prerequisites at the top; a "what you
should see" check in each numbered section; two or three "try it yourself" exercises that ask for a
prediction and check it; a summary and the next notebook; short code cells (the work lives in helpers/)."""

import re
import statistics

import nbformat
import pytest

from helpers.lab.notebooks import NOTEBOOK_DIR, workshop_notebooks

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
