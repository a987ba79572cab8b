"""The course's time per notebook (issue 42, after issue 27): how long each notebook's core path takes, by the honest
clock of ``helpers.lab.clock`` (its rules and their sources are there), in two columns: the workshop (the room of 30
on the cluster: a person's minutes, the compute as an estimate, every core restart at the room's time) and self-study
(a person's minutes and the CPU run measured here).

Per notebook: the core path (the cells before the first that starts with a "## Go deeper" heading, and the closing
"What we learned" section), its run on the CPU path (the per-cell seconds the test suite keeps in
``build/notebook-cells/<test file>/<notebook>.json``, tests/timetable.py) and its core restarts on the cluster (the
changes in a k8s-path run's restart logs, ``restart_changes``; "not measured" without one).

``workshop course-time --write`` keeps the result in ``notebooks/course_time.json`` with its provenance (the machine,
the commit, each run's parameters), writes each notebook's "**Time:**" line from it, and the day's timetable
(``helpers.lab.day``): the lines are generated, never typed. ``time_line_problems`` checks the notebooks against the
record. Everything here is a pure function of notebooks, records and texts it is given; the caller reads the machine
and the commit.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import nbformat

from helpers.core import kit_paths
from helpers.core.errors import WorkshopError
from helpers.core.restarts import GO_DEEPER, core_restarts, read_restarts
from helpers.lab import clock
from helpers.lab.notebooks import CorePathError, core_cells, python_source

RECORD_NAME = "course_time.json"  # beside the notebooks
CELLS_DIR = kit_paths.work_root() / "build" / "notebook-cells"  # tests/timetable.py writes it
GENERATED_BY = "workshop course-time --write"
_HEADING = re.compile(r"#{1,3} +(.+)")
_TIME_LINE = re.compile(r"^\*\*Time:\*\*.*$", re.M)
_WORD = re.compile(r"\S*\w\S*")  # a whitespace-separated token with a letter or digit (not "|---|" or "#")
_INJECTED = "injected-parameters"


CourseTimeError = CorePathError  # a notebook or record the course time cannot be read from; the message says what to fix


# ---------------------------------------------------------------- the core path of a notebook

def words(text: str) -> int:
    """The words of a text: whitespace-separated tokens holding a letter or a digit."""
    return len(_WORD.findall(text))


# ---------------------------------------------------------------- code cells that only call a helper

SHOWN_CALLS = ("print", "should_see", "check_prediction")  # issue 27: what these are given is not counted
_WORK = (ast.BinOp, ast.AugAssign, ast.UnaryOp, ast.If, ast.IfExp, ast.Match, ast.For, ast.AsyncFor, ast.While,
         ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)  # arithmetic, a branch, a loop


def _called_name(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")


def only_helper_calls(source: str) -> bool:
    """Is a code cell only a helper call: no arithmetic, branch or loop (``_WORK``) outside the arguments of
    ``SHOWN_CALLS`` (issue 27's measure)? IPython's ``%`` and ``!`` lines are left out; a cell Python cannot parse
    counts as doing work."""
    try:
        tree = ast.parse(python_source(source))
    except SyntaxError:
        return False
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Call) and _called_name(node) in SHOWN_CALLS:
            continue
        if isinstance(node, _WORK) and not (isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)):
            return False
        todo.extend(ast.iter_child_nodes(node))
    return True


def helper_only_cells(nb: nbformat.NotebookNode) -> tuple[int, int]:
    """(code cells that are only a helper call, code cells), the parameters cell left out of both."""
    code = [c for c in nb.cells if c.cell_type == "code" and "parameters" not in c.get("metadata", {}).get("tags", [])]
    return sum(only_helper_calls(c.source) for c in code), len(code)


@dataclass(frozen=True)
class CellTimes:
    """A notebook's measured run on the CPU path: seconds on the core path and off it, from one record of
    build/notebook-cells/; ``unmatched`` cells of the record are not in this notebook (it changed since)."""

    core_s: float
    deeper_s: float
    unmatched: int
    unmatched_s: float
    test: str
    recorded_at: str
    parameters: str


def _first_line(source: str) -> str:
    return next((line for line in source.splitlines() if line.strip()), "")[:100]


def split_cell_times(nb: nbformat.NotebookNode, record: dict[str, Any]) -> CellTimes:
    """The seconds of a cells record (tests/timetable.py's format) on ``nb``'s core path and off it. A recorded
    cell is found by its index in the executed copy (one more past the parameters cell when parameters were
    injected) and its first line; the injected parameters cell is core; a cell not found counts as unmatched."""
    flags = core_cells(nb)
    params = next((i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    injected = bool(record.get("parameters"))
    core = deeper = unmatched_s = 0.0
    unmatched = 0
    for cell in record.get("cells", []):
        index, seconds, first = int(cell["index"]), float(cell["seconds"]), cell.get("first_line", "")
        if injected and params is not None and index == params + 1 and first.startswith("# Parameters injected"):
            core += seconds
            continue
        source = index - 1 if injected and params is not None and index > params else index
        if 0 <= source < len(nb.cells) and _first_line(nb.cells[source].source) == first:
            if flags[source]:
                core += seconds
            else:
                deeper += seconds
        else:
            unmatched, unmatched_s = unmatched + 1, unmatched_s + seconds
    return CellTimes(round(core, 2), round(deeper, 2), unmatched, round(unmatched_s, 2), record.get("test", ""),
                     record.get("recorded_at", ""), record.get("parameters", ""))


def cells_record(folder: Path, stem: str) -> dict[str, Any] | None:
    """The latest local-path record of notebook ``stem`` in ``folder`` (build/notebook-cells/test_nb*_local/); None
    when no local-path test has run it here."""
    found = []
    for path in sorted(Path(folder).glob(f"*_local/{stem}.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("cells"):
            found.append(record)
    return max(found, key=lambda r: r.get("recorded_at", ""), default=None)


def executed_record(source: nbformat.NotebookNode, executed: nbformat.NotebookNode, run: str) -> dict[str, Any]:
    """A cells record (tests/timetable.py's format) from an executed copy that ``workshop run --out`` wrote (whole or
    ``--core-only``): each code cell's seconds from nbclient's timing, placed on ``source`` by its first line, in
    order; an injected parameters cell counts on the core path. ``run``: what ran it, for the provenance."""
    from helpers.lab.restarts import cell_windows

    windows = iter(cell_windows(executed))
    timed = [c for c in executed.cells if c.cell_type == "code" and c.get("metadata", {}).get("execution", {})
             .get("shell.execute_reply")]
    injected = next((c.source for c in timed if _INJECTED in c.get("metadata", {}).get("tags", [])), "")
    params = next((i for i, c in enumerate(source.cells) if "parameters" in c.get("metadata", {}).get("tags", [])), -1)
    cells, pointer = [], 0
    for cell in timed:
        _, start, end = next(windows)
        first = _first_line(cell.source)
        if _INJECTED in cell.get("metadata", {}).get("tags", []):
            cells.append({"index": params + 1, "seconds": round(end - start, 2), "first_line": first})
            continue
        found = next((i for i in range(pointer, len(source.cells)) if source.cells[i].cell_type == "code"
                      and _first_line(source.cells[i].source) == first), None)
        if found is None:
            cells.append({"index": -1, "seconds": round(end - start, 2), "first_line": first})
            continue
        pointer = found + 1
        cells.append({"index": found + (1 if injected and found > params else 0), "seconds": round(end - start, 2),
                      "first_line": first})
    stamp = max((c.get("metadata", {}).get("execution", {}).get("shell.execute_reply", "") for c in timed), default="")
    return {"test": run, "recorded_at": stamp, "parameters": injected, "cells": cells}


def executed_records(folder: Path, sources: Sequence[Path], run: str) -> dict[str, dict[str, Any]]:
    """The cells record of each notebook of ``sources`` that ``folder`` holds an executed copy of."""
    out = {}
    for path in map(Path, sources):
        copy = Path(folder) / path.name
        if copy.is_file():
            out[path.stem] = executed_record(nbformat.read(path, as_version=4), nbformat.read(copy, as_version=4), run)
    return out


# ---------------------------------------------------------------- restarts, from a k8s-path run

def restart_changes(path: Path) -> dict[str, list[str]]:
    """The core path's restarts of each notebook, as their changes in order (``describe_change``'s words), from a
    ``workshop run --out`` folder of the k8s profile (``NAME.restarts.jsonl`` beside the executed ``NAME.ipynb``): a
    restart counts when it started in a core-path cell. {} for a folder with no log."""
    from helpers.lab.restarts import cell_windows

    out: dict[str, list[str]] = {}
    folder = Path(path)
    for log in sorted(folder.glob("*.restarts.jsonl")) if folder.is_dir() else []:
        stem = log.name.removesuffix(".restarts.jsonl")
        executed = log.with_name(f"{stem}.ipynb")
        if not executed.is_file():
            raise CourseTimeError(f"{log.name}: the executed {stem}.ipynb is not beside it, so its restarts cannot be "
                                  "placed on the core path; give the `workshop run --out` folder that holds both")
        cells = cell_windows(nbformat.read(executed, as_version=4))
        out[stem] = [r.change for r in core_restarts(read_restarts(log), cells)]
    return out


# ---------------------------------------------------------------- one notebook's row

@dataclass(frozen=True)
class CourseTime:
    """One notebook's core path by the honest clock (helpers/lab/clock.py): the person's work, the CPU run, the
    room's restarts, and both columns (None where a part is not measured)."""

    notebook: str
    core_words: int
    all_words: int
    prose_words: int
    code_words: int
    code_cells: int
    exercises: int
    predictions: int
    reading_min: float
    cells_min: float
    tasks_min: float
    person_min: float
    run_s: float | None
    deeper_run_s: float | None
    unmatched_cells: int
    restarts: list[dict[str, Any]] | None  # each core restart: change, kind (storm/flags/back), seconds, why
    restart_min: float | None
    workshop_min: float | None
    self_study_min: float | None
    run: dict[str, str] | None  # the test, when and with which parameters the CPU run was recorded
    helper_only: int = 0  # code cells that are only a helper call (only_helper_calls), of
    code_cells_all: int = 0  # the code cells, the parameters cell left out

    @property
    def restarts_core(self) -> int | None:
        return None if self.restarts is None else len(self.restarts)

    def missing(self) -> list[str]:
        """The parts of the columns that were not measured."""
        return [name for name, value in (("CPU run", self.run_s), ("restarts", self.restarts)) if value is None]


def course_time(stem: str, nb: nbformat.NotebookNode, cells: dict[str, Any] | None, changes: list[str] | None,
                model_bytes: Callable[[str], int | None] = lambda model: None, baseline: str = "") -> CourseTime:
    """A notebook's course time from its source, its cells record (None: not run here) and its core path's restart
    changes on the cluster (None: not measured), priced by ``clock.price_restarts`` with ``model_bytes``."""
    try:
        flags = core_cells(nb)
    except CourseTimeError as err:
        raise CourseTimeError(f"{stem}: {err}") from None
    work = clock.core_work(nb, flags)
    times = split_cell_times(nb, cells) if cells else None
    priced = None if changes is None else clock.price_restarts(changes, baseline, model_bytes)
    both = clock.columns(work, times.core_s if times else None, priced)
    run = {"test": times.test, "recorded_at": times.recorded_at, "parameters": times.parameters} if times else None
    return CourseTime(stem, sum(words(c.source) for c, core in zip(nb.cells, flags) if core),
                      sum(words(c.source) for c in nb.cells), work.prose_words, work.code_words, work.code_cells,
                      work.exercises, work.predictions, round(work.reading_min, 2), round(work.cells_min, 2),
                      round(work.tasks_min, 2), both.person_min, times.core_s if times else None,
                      times.deeper_s if times else None, times.unmatched if times else 0,
                      None if priced is None else [asdict(r) for r in priced], both.restart_min, both.workshop_min,
                      both.self_study_min, run, *helper_only_cells(nb))


def course_notebooks(folder: Path) -> list[Path]:
    """start_here and the numbered notebooks of ``folder``, in the course's order."""
    folder = Path(folder)
    return [p for p in [folder / "start_here.ipynb"] if p.is_file()] + sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def course_times(paths: Sequence[Path], cells_dir: Path = CELLS_DIR, changes: dict[str, list[str]] | None = None,
                 model_bytes: Callable[[str], int | None] = lambda model: None, baseline: str = "",
                 records: dict[str, dict[str, Any]] | None = None) -> list[CourseTime]:
    """The course time of each notebook in ``paths``; ``changes``: the core restarts by notebook from a k8s-path run
    (a numbered notebook it lacks, or None for all: not measured; start_here restarts nothing); ``records``: cells
    records by notebook (``executed_records``) taken instead of the tests' in ``cells_dir``."""
    out = []
    for path in paths:
        path = Path(path)
        nb = nbformat.read(path, as_version=4)
        mine = [] if path.stem == "start_here" else None if changes is None else changes.get(path.stem)
        cells = (records or {}).get(path.stem) or cells_record(cells_dir, path.stem)
        out.append(course_time(path.stem, nb, cells, mine, model_bytes, baseline))
    return out


# ---------------------------------------------------------------- the printed table

def _minutes(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.1f}"


def _restart_words(row: CourseTime) -> str:
    if row.restarts is None:
        return "not measured"
    kinds = [r["kind"] for r in row.restarts]
    return f"{len(kinds)}" + (f" ({clock.kinds_words(kinds)})"
                              if kinds else "")


def table_lines(rows: Sequence[CourseTime]) -> list[str]:
    """The course-time table, both columns: per notebook a person's minutes (reading, cells, exercises and
    predictions), the CPU run, the room's restarts, the workshop's and self-study's totals; then the rules."""
    header = ("notebook", "reading", "cells", "ex+pred", "CPU run (measured)", "restarts on the day", "restart min",
              "workshop min (estimate)", "self-study min")
    body = [(r.notebook, f"{r.reading_min:.1f}", f"{r.cells_min:.1f}", f"{r.tasks_min:.0f} ({r.exercises}+{r.predictions})",
             _minutes(None if r.run_s is None else r.run_s / 60) + (f" ({r.unmatched_cells} cells unmatched)"
                                                                    if r.unmatched_cells else ""),
             _restart_words(r), _minutes(r.restart_min), _minutes(r.workshop_min), _minutes(r.self_study_min))
            for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *body]]
    return lines + [f"A person: {clock.RULES}. The core path: the cells before the first '## {GO_DEEPER}' heading, and the "
                    "closing 'What we learned'. CPU run: the core cells' seconds of an executed copy (--executed: `workshop "
                    "run --core-only` at the defaults) or else of the local-path tests (build/notebook-cells/), the CPU "
                    "engine's own starts included; self-study = a person + the CPU run. "
                    f"Workshop: a person + the compute ({clock.WORKSHOP_RUN_SOURCE}) + each core restart at the room's time "
                    f"({clock.RESTART_SOURCE})."]


# ---------------------------------------------------------------- the record and the Time lines

def make_record(rows: Sequence[CourseTime], machine: dict[str, Any], commit: str, restarts_source: str) -> dict[str, Any]:
    """The committed record of one ``course-time`` run: its rows and their provenance (the machine the CPU runs were
    timed on, the commit, where the restarts came from, the rules and figures used)."""
    return {"generated_by": GENERATED_BY, "commit": commit, "machine": machine, "rules": clock.RULES,
            "prose_wpm": clock.PROSE_WPM, "code_wpm": clock.CODE_WPM, "cell_s": clock.CELL_S,
            "exercise_min": clock.EXERCISE_MIN, "prediction_min": clock.PREDICTION_MIN, "room_size": clock.ROOM_SIZE,
            "restart_source": clock.RESTART_SOURCE, "workshop_run_source": clock.WORKSHOP_RUN_SOURCE,
            "restarts_source": restarts_source,
            "notebooks": [{**asdict(r), "restarts_core": r.restarts_core} for r in rows]}


def read_record(path: Path) -> dict[str, Any]:
    """A record written by ``make_record``; CourseTimeError saying how to make one when it is missing or damaged."""
    try:
        record = json.loads(Path(path).read_text())
    except OSError:
        raise CourseTimeError(f"no course-time record at {path}: run `{GENERATED_BY}` after the notebooks' local-path "
                              "tests (they record each cell's seconds)") from None
    except ValueError as err:
        raise CourseTimeError(f"{path} is not JSON ({err}): regenerate it with `{GENERATED_BY}`") from None
    if not isinstance(record, dict) or not isinstance(record.get("notebooks"), list):
        raise CourseTimeError(f"{path} holds no notebooks list: regenerate it with `{GENERATED_BY}`")
    return record


def _machine_words(machine: dict[str, Any]) -> str:
    return f"{machine.get('cores', '?')}-core {machine.get('cpu', 'CPU')} ({machine.get('isa', '?')})"


def _about(value: float | None) -> str:
    return "not measured" if value is None else f"about {math.ceil(value)} minutes"


def time_line(entry: dict[str, Any], record: dict[str, Any]) -> str:
    """A notebook's "**Time:**" line, from its entry in the record (nothing typed)."""
    restarts = entry["restarts"]
    if restarts is None:
        room = "its engine restarts on the day not measured"
    elif not restarts:
        room = "no engine restart"
    else:
        kinds = [r["kind"] for r in restarts]
        room = (f"{len(kinds)} engine restart{'' if len(kinds) == 1 else 's'} "
                f"({clock.kinds_words(kinds)}) at the "
                f"room's time, {entry['restart_min']:.1f} min")
    run = ("the CPU run not measured" if entry["run_s"] is None else
           f"{entry['run_s'] / 60:.1f} min running on a {_machine_words(record['machine'])}")
    return (f"**Time:** the core path takes {_about(entry['workshop_min'])} at the workshop (an estimate: "
            f"{entry['person_min']:.1f} min reading, running cells, {entry['exercises']} exercise"
            f"{'' if entry['exercises'] == 1 else 's'} and {entry['predictions']} prediction"
            f"{'' if entry['predictions'] == 1 else 's'}; {room}) and {_about(entry['self_study_min'])} in self-study "
            f"({run}). Generated by `{GENERATED_BY}` (notebooks/{RECORD_NAME}, commit {record['commit'][:12]}).")


def time_lines(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell index, line) of every "**Time:**" line in the markdown cells before the first code cell."""
    out = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            break
        out += [(index, m.group(0)) for m in _TIME_LINE.finditer(cell.source)]
    return out


def _entries(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["notebook"]: e for e in record["notebooks"]}


def time_line_problems(paths: Sequence[Path], record: dict[str, Any]) -> list[str]:
    """A sentence per notebook whose "**Time:**" line is not the one the record generates (start_here needs none)."""
    entries, problems = _entries(record), []
    for path in map(Path, paths):
        found = time_lines(nbformat.read(path, as_version=4))
        if not found and path.stem == "start_here":
            continue
        if path.stem not in entries:
            problems.append(f"{path.name}: not in the record; regenerate it with `{GENERATED_BY}`")
            continue
        want = time_line(entries[path.stem], record)
        if len(found) != 1:
            problems.append(f"{path.name}: {len(found)} '**Time:**' lines before the first code cell, expected one")
        elif found[0][1] != want:
            problems.append(f"{path.name}: its Time line is not the record's; run `{GENERATED_BY}` "
                            f"(has {found[0][1][:80]!r}...)")
        elif runs_on := _run_on(nbformat.read(path, as_version=4).cells[found[0][0]].source, found[0][1]):
            problems.append(f"{path.name}: the line after its Time line continues that paragraph ({runs_on!r}); "
                            f"`{GENERATED_BY}` replaces one line, so this is what an older, longer Time line left: "
                            f"delete it or leave a blank line between")
    return problems


def _run_on(source: str, line: str) -> str:
    """The line that follows ``line`` in the same markdown paragraph ("" when a blank line or the cell's end comes)."""
    rest = source.split(line, 1)[1].removeprefix("\n")
    return rest.split("\n", 1)[0].strip()


def write_time_lines(paths: Sequence[Path], record: dict[str, Any]) -> list[Path]:
    """Put the record's "**Time:**" line into each notebook that has one (the whole line is replaced; cell ids,
    metadata and the other cells are kept); the notebooks changed."""
    entries, changed = _entries(record), []
    for path in map(Path, paths):
        nb = nbformat.read(path, as_version=4)
        found = time_lines(nb)
        if path.stem not in entries or not found:
            if path.stem != "start_here":
                raise CourseTimeError(f"{path.name}: " + ("not in the record" if found else
                                      "no '**Time:**' line in its first markdown cells to replace"))
            continue
        if len(found) != 1:
            raise CourseTimeError(f"{path.name}: {len(found)} '**Time:**' lines; keep one in its first markdown cells")
        index, old = found[0]
        new = time_line(entries[path.stem], record)
        if new != old:
            nb.cells[index].source = nb.cells[index].source.replace(old, new, 1)
            nbformat.write(nb, path)
            changed.append(path)
    return changed


# ---------------------------------------------------------------- the record against the notebooks as they are

COUNTED = ("prose_words", "code_words", "code_cells", "exercises", "predictions")  # what an edit of a core path moves


def record_problems(paths: Sequence[Path], record: dict[str, Any]) -> list[str]:
    """A sentence per notebook whose core path no longer counts what the record says (an edit since the record was
    written): the record must be regenerated."""
    entries, out = _entries(record), []
    for path in map(Path, paths):
        entry = entries.get(path.stem)
        if entry is None:
            out.append(f"{path.name}: not in the record; regenerate it with `{GENERATED_BY}`")
            continue
        nb = nbformat.read(path, as_version=4)
        work = asdict(clock.core_work(nb, core_cells(nb)))
        moved = [f"{k} {entry.get(k)} -> {work[k]}" for k in COUNTED if entry.get(k) != work[k]]
        if moved:
            out.append(f"{path.name}: its core path changed since the record ({'; '.join(moved)}); run `{GENERATED_BY}`")
    return out


_MINUTES_LINE = re.compile(r"^\*\*Minutes:\*\*.*$", re.M)


def minutes_line(entry: dict[str, Any], record: dict[str, Any]) -> str:
    """A facilitator page's "**Minutes:**" line, from the notebook's entry in the record."""
    restarts = entry.get("restarts")
    storms = sum(r["kind"] == "storm" for r in restarts or [])
    return (f"**Minutes:** the core path takes {_about(entry['workshop_min'])} at the workshop (an estimate; "
            f"{'restarts not measured' if restarts is None else _restarts_words(len(restarts), storms)}) "
            f"and {_about(entry['self_study_min'])} in self-study. Generated by `{GENERATED_BY}` from "
            f"notebooks/{RECORD_NAME} (commit {record['commit'][:12]}); the day's timetable is [day.md](day.md).")


def _restarts_words(count: int, storms: int) -> str:
    """``"2 restarts, 1 a storm"``, ``"1 restart"``, ``"no restart"``."""
    if not count:
        return "no restart"
    words = f"{count} restart{'' if count == 1 else 's'}"
    return words + ("" if not storms else f", {storms} a storm" if storms == 1 else f", {storms} storms")


def write_facilitator_minutes(docs: Path, record: dict[str, Any]) -> list[Path]:
    """Put each notebook's "**Minutes:**" line into its facilitator page (docs/facilitator/NN.md), after the title
    (replaced when there is one); the pages changed."""
    changed = []
    for entry in record["notebooks"]:
        page = Path(docs) / f"{entry['notebook'][:2]}.md"
        if not re.match(r"\d\d_", entry["notebook"]) or not page.is_file():
            continue
        text, line = page.read_text(), minutes_line(entry, record)
        new = _MINUTES_LINE.sub(line, text, count=1) if _MINUTES_LINE.search(text) else text.replace(
            "\n", f"\n\n{line}\n", 1)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


def minutes_problems(docs: Path, record: dict[str, Any]) -> list[str]:
    """A sentence per facilitator page whose "**Minutes:**" line is not the record's."""
    out = []
    for entry in record["notebooks"]:
        page = Path(docs) / f"{entry['notebook'][:2]}.md"
        if not re.match(r"\d\d_", entry["notebook"]):
            continue
        found = _MINUTES_LINE.findall(page.read_text()) if page.is_file() else []
        if found != [minutes_line(entry, record)]:
            out.append(f"{page.name}: its Minutes line is not the record's; run `{GENERATED_BY}`")
    return out


def write_start_here_day(path: Path, block: str) -> list[Path]:
    """Put the day's side-by-side table (``day.side_by_side``) into start_here's markdown cell that holds the
    generated block, or the last markdown cell; [path] when it changed."""
    from helpers.lab.day import block_of, replace_block

    if not Path(path).is_file():
        return []
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "markdown"]
    cell = next((c for c in cells if block_of(c.source) is not None), cells[-1])
    new = replace_block(cell.source, block)
    if new == cell.source:
        return []
    cell.source = new
    nbformat.write(nb, path)
    return [Path(path)]
