"""The local path's notebook runs: the shared engine as the notebooks' kernels see it, and the checks after each run
(no long cell without a progress display; every should-see check decided on data, tests/should_see_checks.py).

Each ``tests/test_nb*_local.py`` runs one notebook top to bottom against the suite's shared engine (tests/conftest.py
``shared_engine``: its own port and state directory, on the default configuration when a module begins) and reads
what it printed. The cluster path runs the same notebooks in tests/test_k8s_path_notebooks.py.
"""

from __future__ import annotations

import warnings

import nbformat
import pytest

from should_see_checks import problems

from helpers.lab.notebooks import LONG_CELL_S, REPO_ROOT, run_notebook

NOTEBOOKS = REPO_ROOT / "notebooks"


@pytest.fixture(scope="module")
def lab(shared_engine):
    """The shared engine on its port, this process's environment on its port and state directory for the module (the
    notebooks' kernels connect through it); the next test that uses it finds it back on the default configuration."""
    with shared_engine.use() as lab:
        yield lab


_RUNS: list = []
_ALLOWED: dict[int, dict[str, str]] = {}  # id(run): the claims that may lack data in that run, with the reason
BLIND_CELL_S = 6 * LONG_CELL_S


def run_local(name: str, out_dir, allow_lack_of_data: dict[str, str] | None = None, **kwargs):
    """``run_notebook`` on notebooks/``name``, its run kept for the checks after the test (``no_silent_long_cells``,
    ``every_check_decided``). ``allow_lack_of_data``: claims (a part of their text) that may print "cannot tell" for
    lack of data in this run, each with the reason (a test that runs a notebook below its CI parameters on purpose)."""
    run = run_notebook(NOTEBOOKS / name, out_dir, **kwargs)
    _RUNS.append(run)
    _ALLOWED[id(run)] = dict(allow_lack_of_data or {})
    return run


@pytest.fixture(autouse=True)
def no_silent_long_cells():
    """Every executed notebook: no cell ran longer than LONG_CELL_S without a progress display (issue 13), and every
    "What you should see" check was decided on data (issue 31: the CI parameters execute every check): none said
    "cannot tell" (or "not seen") for lack of data, and every check its source always runs printed
    (tests/should_see_checks.py). The test files import this fixture by name, so it holds both checks."""
    _RUNS.clear()
    _ALLOWED.clear()
    yield
    silent = [(run.source.name, cell) for run in _RUNS for cell in run.silent_cells]
    if silent:  # listed in the warnings summary: over 5 s depends on the machine, so it is reported, not judged
        warnings.warn(f"cells that ran over {LONG_CELL_S:g} s without a progress display: "
                      + "; ".join(f"{name} {cell}" for name, cell in silent))
    # A cell silent for six times that is a long step without progress on any machine: that fails.
    blind = [f"{name} {cell}" for name, cell in silent if cell.seconds > BLIND_CELL_S]
    undecided = [f"{run.source.name} {problem}" for run in _RUNS for problem in problems(run.output, _ALLOWED[id(run)])]
    failures = []
    if blind:
        failures.append(f"cells that ran over {BLIND_CELL_S:g} s without a progress display:\n" + "\n".join(blind))
    if undecided:
        failures.append("should-see checks not decided on this run's data: raise the CI parameters the test passes (or "
                        "name the claim in run_local(..., allow_lack_of_data={claim: why})):\n" + "\n".join(undecided))
    assert not failures, "\n\n".join(failures)


def printed(run) -> str:
    """Everything the executed notebook's code cells printed, as one text."""
    nb = nbformat.read(run.output, as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
