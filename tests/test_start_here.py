"""The lab's first screen: every notebook of the path listed under its own title with a working link, and a cell that
shows the engine's status without starting it (so it runs top to bottom with or without an engine)."""

import re

import nbformat

from helpers.lab.notebooks import NOTEBOOK_DIR, run_notebook, workshop_notebooks
from helpers.core.settings import CONTRACT_VARIABLES
from helpers.lab.workspace import START_HERE

PATH = NOTEBOOK_DIR / START_HERE


def _links(nb) -> list[tuple[str, str]]:
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return re.findall(r"\[([^\]]+)\]\(([^)]+\.ipynb)\)", text)


def test_every_link_goes_to_a_notebook_and_every_notebook_is_on_the_path_under_its_title():
    nb = nbformat.read(PATH, as_version=4)
    links = _links(nb)
    assert links, "start_here links to no notebook"
    for title, target in links:
        assert (NOTEBOOK_DIR / target).is_file(), f"the link to {target} goes nowhere"
        heading = nbformat.read(NOTEBOOK_DIR / target, as_version=4).cells[0].source.splitlines()[0]
        assert heading == f"# {title}", f"{target} is listed as {title!r}, its title is {heading!r}"
    assert {p.name for p in workshop_notebooks()} <= {target for _, target in links}, "a notebook is missing"
    assert "**Next:** [01 · " in nb.cells[-1].source


def test_it_is_committed_without_outputs_and_not_counted_as_a_lesson():
    nb = nbformat.read(PATH, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    assert PATH not in workshop_notebooks()


def test_it_runs_top_to_bottom_without_an_engine_and_says_so(tmp_path, monkeypatch):
    for name in CONTRACT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORKSHOP_PORT", "8819")  # nothing listens there: the status, not a start
    monkeypatch.setenv("WORKSHOP_STATE_DIR", str(tmp_path / "state"))
    run = run_notebook(PATH, tmp_path / "out", timeout_s=120)
    text = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                     for c in nbformat.read(run.output, as_version=4).cells if c.cell_type == "code" for o in c.outputs)
    assert "The engine is not running. Start it with `workshop up`" in text
    assert "not set" in text and "NaN" not in text
