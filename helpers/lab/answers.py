"""Predict, then measure (issue 42 parts 5 and 6): where a notebook's checks are, and whether anything above one gives
its answer away.

A *check* is a section (a markdown heading and the cells up to the next heading) that holds a code exercise (a cell
tagged ``exercise``) or a prediction (a code cell that assigns ``MY_PREDICTION``). Each lesson module keeps, in
``ANSWERS``, the phrases that give each core-path check's answer away, keyed by the check's heading: the sentence that
explains a prediction's outcome, or the number an exercise asks for when the parameters fix it. An answer is
*visible above its check* when one of its phrases is in a cell above the check's heading: in a cell's source, or, in
an executed copy, in a cell's output (a table or a printout already shown). Text is compared with case, spacing and
markdown's ``*``, ``_`` and backticks ignored. A phrase must be specific enough to count (ANSWER_MIN_WORDS words, or a
number): a common word like "fewer" is no answer. Pure functions of notebooks; the tests and the cluster-path run
call them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import nbformat

from helpers.lab.notebooks import PREDICTION, core_cells

ANSWER_MIN_WORDS = 3  # a phrase of fewer words must hold a number to count as an answer
_HEADING = re.compile(r"^(#{1,4}) +(.+)$")
_MARKUP = re.compile(r"[*_`]")


@dataclass(frozen=True)
class Check:
    """An exercise or a prediction: its heading, the heading cell's index, its kind, and whether it is on the core
    path."""

    heading: str
    index: int
    kind: str  # "exercise" or "prediction"
    core: bool


def normal(text: str) -> str:
    """Lower case, markdown emphasis and code marks dropped, whitespace collapsed: the form phrases are compared in."""
    return " ".join(_MARKUP.sub("", str(text)).lower().split())


def heading(cell: nbformat.NotebookNode) -> str | None:
    """A markdown cell's heading text (its first line without the hashes), or None."""
    if cell.cell_type != "markdown":
        return None
    first = cell.source.strip().split("\n", 1)[0]
    found = _HEADING.match(first)
    return found.group(2).strip() if found else None


def checks(nb: nbformat.NotebookNode) -> list[Check]:
    """Every exercise and prediction section of ``nb``, in order."""
    flags = core_cells(nb)
    found: dict[int, Check] = {}
    current: tuple[str, int] | None = None
    for index, cell in enumerate(nb.cells):
        title = heading(cell)
        if title is not None:
            current = (title, index)
            continue
        if cell.cell_type != "code" or current is None:
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        kind = "exercise" if "exercise" in tags else "prediction" if PREDICTION.search(cell.source) else None
        if kind and current[1] not in found:
            found[current[1]] = Check(current[0], current[1], kind, flags[index])
    return list(found.values())


def is_specific(phrase: str) -> bool:
    """Whether a phrase is specific enough to give an answer away: ANSWER_MIN_WORDS words, or a number."""
    return len(normal(phrase).split()) >= ANSWER_MIN_WORDS or bool(re.search(r"\d", phrase))


def cell_text(cell: nbformat.NotebookNode, outputs: bool) -> str:
    """A cell's source, and with ``outputs`` its printed and plain-text outputs."""
    parts = [cell.source]
    if outputs and cell.cell_type == "code":
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def answer_problems(nb: nbformat.NotebookNode, answers: Mapping[str, Sequence[str]], outputs: bool = False,
                    core_only: bool = True) -> list[str]:
    """A sentence per problem with ``answers`` (a lesson module's ANSWERS) in ``nb``: a core-path check with no
    entry, an entry with no such check, a phrase too common to count, and a phrase visible above its check (with
    ``outputs``, in what an executed copy shows too). ``core_only``: the checks of the core path only."""
    problems = []
    found = {c.heading: c for c in checks(nb) if c.core or not core_only}
    headings = {heading(c) for c in nb.cells} - {None}
    for title in found:
        if not answers.get(title):
            problems.append(f"{title!r}: a {found[title].kind} with no entry in ANSWERS (what gives its answer away)")
    for title, phrases in answers.items():
        if title not in headings:
            problems.append(f"{title!r}: in ANSWERS, but no heading of the notebook reads so")
            continue
        check = found.get(title)
        if check is None:
            continue
        above = [normal(cell_text(c, outputs)) for c in nb.cells[:check.index]]
        for phrase in phrases:
            if not is_specific(phrase):
                problems.append(f"{title!r}: {phrase!r} is too common to be an answer (give {ANSWER_MIN_WORDS}+ "
                                "words or a number)")
                continue
            cells = [i for i, text in enumerate(above) if normal(phrase) in text]
            if cells:
                where = "output" if outputs and all(normal(phrase) not in normal(nb.cells[i].source)
                                                    for i in cells) else "source"
                problems.append(f"{title!r}: its answer {phrase!r} is visible above it, in the {where} of cell "
                                f"{cells[0]}")
    return problems
