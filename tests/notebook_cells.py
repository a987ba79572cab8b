"""A notebook's own cells, found by tag and run outside the notebook: the mechanism cells (tag ``mechanism``) and the
code exercises (``exercise``, then its collapsed ``solution``) are tested from the shipped .ipynb, never from a copy."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def tagged_cells(path: Path, tag: str) -> list[nbformat.NotebookNode]:
    """The cells of the notebook at ``path`` that carry ``tag``, in order."""
    return [c for c in nbformat.read(path, as_version=4).cells if tag in c.metadata.get("tags", [])]


def tagged(path: Path, tag: str) -> nbformat.NotebookNode:
    """The one cell of the notebook at ``path`` that carries ``tag`` (fails when there are none or several)."""
    cells = tagged_cells(path, tag)
    assert len(cells) == 1, f"{Path(path).name}: {len(cells)} cells tagged {tag!r}, expected one"
    return cells[0]


def run_cells(*sources: str, **names) -> dict:
    """The cells' sources run in turn in one fresh namespace holding ``names``, as a notebook runs them."""
    namespace = dict(names)
    for source in sources:
        exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 - the notebook's own cells
    return namespace


def with_answer(source: str, name: str, answer: str) -> str:
    """The exercise cell with the learner's ``None`` replaced by ``answer``."""
    changed, n = re.subn(rf"^{name} = None\b", f"{name} = {answer}", source, flags=re.M)
    assert n == 1, f"the exercise cell sets {name} = None once"
    return changed
