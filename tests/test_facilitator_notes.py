"""The facilitator notes (issue 27 part 7): one page per notebook in docs/facilitator/, each short, pointing at the
course-time record for its minutes, and naming only "What you should see" checks its notebook makes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from helpers.lab.course_time import RECORD_NAME, course_notebooks

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS, PAGES = REPO / "notebooks", REPO / "docs" / "facilitator"
CHECK_CALLS = ("should_see", "should_see_conclusion", "show_conclusions")
MAX_LINES = 60
_HANDLE = re.compile(r"^- `([^`]+)`", re.M)  # a check named at the start of a bullet, in backticks


def page_of(notebook: Path) -> Path:
    """``01_connect_and_first_agent.ipynb`` -> docs/facilitator/01.md; start_here -> start_here.md."""
    return PAGES / f"{notebook.stem if notebook.stem == 'start_here' else notebook.stem[:2]}.md"


def check_sources(nb: nbformat.NotebookNode) -> list[str]:
    """The source a check can be named by: every should_see / should_see_conclusion / show_conclusions call; and,
    where a call's claim is not written as a string (``growth.expectation``), the whole cell that computes it."""
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            name = getattr(node, "func", None)
            name = getattr(name, "id", None) or getattr(name, "attr", None)
            if isinstance(node, ast.Call) and name in CHECK_CALLS and node.args:
                out.append(ast.get_source_segment(cell.source, node) or "")
                if not isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
                    out.append(cell.source)
    return out


def checks_section(page: str) -> str:
    """The page's text from its first "## The checks" heading to the next "## What to say" (or the end)."""
    start = page.find("## The checks")
    end = page.find("## What to say", start)
    return "" if start < 0 else page[start:end if end > 0 else None]


def unknown_checks(page: str, nb: nbformat.NotebookNode) -> list[str]:
    """The checks a page names (``- `words` ...`` bullets under "## The checks") that its notebook does not make."""
    sources = check_sources(nb)
    return [h for h in _HANDLE.findall(checks_section(page)) if not any(h in s for s in sources)]


def test_the_check_finder_reads_literal_claims_f_strings_and_computed_ones():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        'growth = conclude_growth(x)\nshould_see("a literal claim", True)\nshould_see(f"{n} users wait", ok)\n'
        "should_see_conclusion(growth.expectation, growth)")])
    page = ("# 09\n\n## The checks\n- `a literal claim`: yes\n- ` users wait`: yes\n- `conclude_growth`: yes\n"
            "- `a claim the notebook never makes`: no\n\n## What to say\n- `not a check`: prose\n")
    assert unknown_checks(page, nb) == ["a claim the notebook never makes"]
    assert page_of(Path("notebooks/09_x.ipynb")) == PAGES / "09.md"
    assert page_of(Path("notebooks/start_here.ipynb")) == PAGES / "start_here.md"


@pytest.mark.parametrize("notebook", course_notebooks(NOTEBOOKS), ids=lambda p: p.stem)
def test_every_notebook_has_a_short_page_that_names_only_its_own_checks(notebook):
    page_path = page_of(notebook)
    assert page_path.is_file(), f"write {page_path.relative_to(REPO)}: facilitator notes for {notebook.name}"
    page = page_path.read_text()
    assert len(page.splitlines()) <= MAX_LINES, f"{page_path.name}: keep it under {MAX_LINES} lines"
    assert "## Before the day" in page and "## The checks" in page
    # the minutes are the record's (a generated **Minutes:** line, checked against it in tests/test_course_time.py);
    # start_here's page, with no line of its own, points at the record
    minutes = [line for line in page.splitlines() if line.startswith(("**Minutes:**", "**Core minutes:**"))]
    assert len(minutes) == 1 and RECORD_NAME in minutes[0], "one Minutes line, generated from the record"
    assert minutes[0].startswith("**Minutes:**") or not re.search(r"\d+ min", minutes[0]), "do not type the minutes"
    nb = nbformat.read(notebook, as_version=4)
    assert unknown_checks(page, nb) == [], f"{page_path.name} names checks {notebook.name} does not make"
    if check_sources(nb):  # a notebook with checks: the page names at least one, each with what it prints
        assert _HANDLE.findall(checks_section(page))


def test_the_index_links_every_page():
    index = (PAGES / "README.md").read_text()
    for notebook in course_notebooks(NOTEBOOKS):
        assert f"]({page_of(notebook).name})" in index
