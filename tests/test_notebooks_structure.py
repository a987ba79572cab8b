"""Notebooks are numbered, committed without outputs or widget state, python3, one parameters cell."""

import re

import nbformat
import pytest

from helpers.lab.notebooks import NOTEBOOK_DIR, inject_parameters, parameters_cell_index, parse_parameters, workshop_notebooks

NOTEBOOKS = workshop_notebooks()


def test_notebooks_exist_and_are_numbered_once_each_within_the_eight_lessons():
    names = [p.name for p in NOTEBOOKS]
    assert names, f"no notebooks in {NOTEBOOK_DIR}"
    numbers = [int(re.match(r"(\d\d)_[a-z0-9_]+\.ipynb$", n).group(1)) for n in names]
    assert numbers == sorted(set(numbers)) and set(numbers) <= set(range(1, 9))
    assert numbers[:2] == [1, 2]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_clean(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert "widgets" not in nb.metadata
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has outputs"
    parameters_cell_index(nb)  # exactly one parameters cell
    assert nb.cells[-1].cell_type == "code", "the last cell prints what was learned"


def test_parameters_are_injected_after_the_parameters_cell():
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    index = parameters_cell_index(nb)
    inject_parameters(nb, parse_parameters(["STREAM_MAX_TOKENS=8", "LABEL=quick"]))
    assert nb.cells[index + 1].source.endswith("STREAM_MAX_TOKENS = 8\nLABEL = 'quick'")


def test_bad_parameter_syntax_is_refused():
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_parameters(["no-equals-sign"])


def test_a_widget_cell_gets_the_short_timeout_and_a_measuring_cell_the_long_one():
    from helpers.lab.notebooks import WIDGET_CELL_TIMEOUT_S, cell_timeout_s

    widget = nbformat.v4.new_code_cell("import ipywidgets as widgets\nwidgets.interact(f, x=(1, 3))")
    sweep = nbformat.v4.new_code_cell("results = run_sweep(lab.settings, workload)")
    assert cell_timeout_s(widget, 1800) == WIDGET_CELL_TIMEOUT_S < 1800
    assert cell_timeout_s(sweep, 1800) == 1800 and cell_timeout_s(widget, 30) == 30
    explorer = [c for c in nbformat.read(NOTEBOOK_DIR / "02_units_and_memory_budget.ipynb", as_version=4).cells
                if c.cell_type == "code" and "widgets.interact" in c.source]
    assert len(explorer) == 1 and cell_timeout_s(explorer[0], 1800) == WIDGET_CELL_TIMEOUT_S


LESSON_MODULES = {"01": "helpers.lessons.l01_connect", "02": "helpers.lessons.l02_memory", "03": "helpers.lessons.l03",
                  "04": "helpers.lessons.l04_moe", "05": "helpers.lessons.l05_quantization",
                  "06": "helpers.lessons.l06", "07": "helpers.lessons.l07_saturation",
                  "08": "helpers.lessons.l08_tuning"}


def helper_imports(path) -> set[str]:
    """The helpers modules a notebook's code cells import from (``from helpers.x import y`` names helpers.x)."""
    import ast

    found = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "helpers":
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "helpers")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_imports_its_own_lesson_module_and_the_session_only(path):
    own = LESSON_MODULES[path.name[:2]]
    assert helper_imports(path) == {own, "helpers.engine.session"}, "import the floors' names through " + own
    readme = (NOTEBOOK_DIR.parent / "helpers" / "README.md").read_text()
    shown = own.removeprefix("helpers.").replace(".", "/")
    shown += "/" if (NOTEBOOK_DIR.parent / "helpers" / shown).is_dir() else ".py"  # a lesson package or module
    assert f"`{shown}`" in readme, f"helpers/README.md maps notebook {path.name[:2]} to {shown}"
