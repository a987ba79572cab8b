"""A notebook run's engine restarts on the cluster, section by section: the rows of ``workshop run``'s restart table.

``workshop run`` points ``$WORKSHOP_RESTART_LOG`` at a fresh log for each notebook; the Kubernetes engine in the
notebook's kernel appends one record per rollout (``helpers.core.restarts``). Each record is placed in the cell
that was running when it started (the executed notebook keeps every cell's start and end, ``record_timing``),
and so in that cell's section: on the core path, or in a "Go deeper" section after it.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import nbformat

from helpers.core.restarts import RestartRow, count, read_restarts
from helpers.lab.notebooks import cell_sections


def _unix(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def cell_windows(nb: nbformat.NotebookNode) -> list[tuple[str, float, float]]:
    """(section, start, end) of every executed code cell, Unix seconds, from the timing nbclient recorded."""
    out = []
    for cell, section in zip(nb.cells, cell_sections(nb)):
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if cell.cell_type == "code" and start and end:
            out.append((section, _unix(start), _unix(end)))
    return out


def restart_row(executed: Path, log: Path) -> RestartRow:
    """The restart table's row of one executed notebook and its restart log."""
    nb = nbformat.read(executed, as_version=4)
    return count(Path(executed).stem, read_restarts(log), cell_windows(nb))
