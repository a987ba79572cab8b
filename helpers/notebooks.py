"""Execute the workshop notebooks headless with nbclient, against the current engine.

Executed copies go outside the source tree (``build/executed/`` by default, ignored by git), so the
committed notebooks stay without outputs. Parameters override the ``parameters``-tagged cell by
inserting a cell right after it, as papermill does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
DEFAULT_OUT = REPO_ROOT / "build" / "executed"


class NotebookRunError(RuntimeError):
    """A cell failed; the message names the notebook, the cell and the error."""


@dataclass
class NotebookRun:
    """One executed notebook: where its executed copy is and how long it took."""

    source: Path
    output: Path
    seconds: float


def workshop_notebooks() -> list[Path]:
    """The numbered notebooks, in order."""
    return sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))


def parameters_cell_index(nb: nbformat.NotebookNode) -> int:
    """Index of the single cell tagged ``parameters``."""
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise NotebookRunError(f"expected exactly one cell tagged 'parameters', found {len(tagged)}")
    return tagged[0]


def inject_parameters(nb: nbformat.NotebookNode, parameters: dict[str, Any]) -> None:
    """Insert a cell assigning ``parameters`` right after the parameters cell."""
    if not parameters:
        return
    source = "# Parameters injected by `workshop run`\n" + "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(parameters_cell_index(nb) + 1, cell)


# A cell that builds interactive widgets measures nothing and runs in seconds. Headless, the reply to
# such a cell was sometimes picked up only when nbclient's wait for it timed out (a lost wake-up: the
# kernel had answered and was idle; seen in 3 of 5 runs of notebook 02 in the suite, with ipykernel 7.4
# and 6.31 alike), so these cells get a short timeout instead of the measuring cells' long one.
WIDGET_CELL_TIMEOUT_S = 60


def cell_timeout_s(cell: nbformat.NotebookNode, timeout_s: int) -> int:
    """The seconds nbclient may wait for one cell: short for a widget cell, ``timeout_s`` otherwise."""
    return min(timeout_s, WIDGET_CELL_TIMEOUT_S) if "ipywidgets" in cell.get("source", "") else timeout_s


def run_notebook(path: Path, out_dir: Path = DEFAULT_OUT, parameters: dict[str, Any] | None = None,
                 timeout_s: int = 1800) -> NotebookRun:
    """Execute one notebook top to bottom; raise NotebookRunError on the first failing cell."""
    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    inject_parameters(nb, parameters or {})
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / path.name
    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            timeout_func=lambda cell: cell_timeout_s(cell, timeout_s))
    start = time.monotonic()
    try:
        client.execute()
    except CellExecutionError as err:
        nbformat.write(nb, output)
        raise NotebookRunError(f"{path.name} failed (partial output in {output}):\n{err}") from None
    nbformat.write(nb, output)
    return NotebookRun(path, output, time.monotonic() - start)


def parse_parameters(pairs: list[str]) -> dict[str, Any]:
    """``["n=3", "profile='cpu'"]`` -> ``{"n": 3, "profile": "cpu"}`` (JSON values, else strings)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"parameter must look like NAME=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out
