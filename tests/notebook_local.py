"""The local path's notebook runs: the shared engine as the notebooks' kernels see it, and the check on long cells.

Each ``tests/test_nb*_local.py`` runs one notebook top to bottom against the suite's shared engine (tests/conftest.py
``shared_engine``: its own port and state directory, on the default configuration when a module begins) and reads
what it printed. The cluster path runs the same notebooks in tests/test_k8s_path_notebooks.py.
"""

from __future__ import annotations

import warnings

import nbformat
import pytest

from helpers.lab.notebooks import LONG_CELL_S, REPO_ROOT, run_notebook

NOTEBOOKS = REPO_ROOT / "notebooks"


@pytest.fixture(scope="module")
def lab(shared_engine):
    """The shared engine on its port, this process's environment on its port and state directory for the module (the
    notebooks' kernels connect through it); the next test that uses it finds it back on the default configuration."""
    with shared_engine.use() as lab:
        yield lab


_RUNS: list = []
BLIND_CELL_S = 6 * LONG_CELL_S


def run_local(name: str, out_dir, **kwargs):
    """``run_notebook`` on notebooks/``name``, its run kept for ``no_silent_long_cells`` to check after the test."""
    run = run_notebook(NOTEBOOKS / name, out_dir, **kwargs)
    _RUNS.append(run)
    return run


@pytest.fixture(autouse=True)
def no_silent_long_cells():
    """Every executed notebook: no cell ran longer than LONG_CELL_S without a progress display (issue 13)."""
    _RUNS.clear()
    yield
    silent = [(run.source.name, cell) for run in _RUNS for cell in run.silent_cells]
    if silent:  # listed in the warnings summary: over 5 s depends on the machine, so it is reported, not judged
        warnings.warn(f"cells that ran over {LONG_CELL_S:g} s without a progress display: "
                      + "; ".join(f"{name} {cell}" for name, cell in silent))
    # A cell silent for six times that is a long step without progress on any machine: that fails.
    blind = [f"{name} {cell}" for name, cell in silent if cell.seconds > BLIND_CELL_S]
    assert not blind, f"cells that ran over {BLIND_CELL_S:g} s without a progress display:\n" + "\n".join(blind)


def printed(run) -> str:
    """Everything the executed notebook's code cells printed, as one text."""
    nb = nbformat.read(run.output, as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
