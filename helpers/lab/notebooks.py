"""Execute the workshop notebooks headless with nbclient, against the current engine.

Executed copies go outside the source tree (``build/executed/`` by default, ignored by git), so the
committed notebooks stay without outputs. Parameters override the ``parameters``-tagged cell by
inserting a cell right after it, as papermill does.

``workshop run -p NAME=VALUE`` checks every parameter before anything starts (``check_parameters``):
NAME must be assigned in the parameters cell of at least one notebook to run, and VALUE must have
the type of that default. A parameter goes to the notebooks that have it and is refused only when
none of them has it, so ``-p REPEATS=1`` shortens every notebook that repeats and leaves the others.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from helpers.core import kit_paths
from helpers.core.errors import WorkshopError
from helpers.core.restarts import GO_DEEPER

REPO_ROOT = kit_paths.kit_root()  # the clone; for a wheel, helpers/kit/ (its copies of notebooks/, k8s/, models/)
NOTEBOOK_DIR = kit_paths.kit_dir("notebooks")
DEFAULT_OUT = kit_paths.work_root() / "build" / "executed"  # in the clone; for a wheel, under the current folder


class NotebookRunError(WorkshopError, RuntimeError):
    """A cell failed; the message names the notebook, the cell and the error."""


class CorePathError(WorkshopError, ValueError):
    """A notebook whose core path cannot be told from its Go deeper sections; the message says what to fix."""


class ParameterError(WorkshopError, ValueError):
    """A ``-p NAME=VALUE`` that no notebook to run can take; the message says what would be taken."""


@dataclass
class NotebookRun:
    """One executed notebook: where its executed copy is, how long it took, and its cells that ran longer
    than LONG_CELL_S without showing progress (``silent_long_cells``)."""

    source: Path
    output: Path
    seconds: float
    silent_cells: list["SilentCell"] = field(default_factory=list)


def workshop_notebooks() -> list[Path]:
    """The numbered notebooks, in order."""
    return sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """A notebook file, read; NotebookRunError naming the file when it is not a notebook."""
    try:
        return nbformat.read(Path(path), as_version=4)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # NotJSONError is a ValueError
        raise NotebookRunError(f"{path} is not a readable notebook ({type(err).__name__}: "
                               f"{str(err).splitlines()[0][:200] if str(err) else 'no detail'}); "
                               "give an .ipynb file, e.g. notebooks/02_units_and_memory_budget.ipynb") from None


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


def cell_sections(nb: nbformat.NotebookNode) -> list[str]:
    """For each cell, the heading of the section it is in (``"2. A first chat completion"``; "" before the first
    heading), so a progress line can say where a run is."""
    out, current = [], ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heading = re.match(r"#{1,3} +(.+)", cell.source.strip())
            current = heading.group(1).strip() if heading else current
        out.append(current)
    return out


def _is_code(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and bool(cell.source.strip())


GO_DEEPER_HEADING = re.compile(rf"^## +{GO_DEEPER}\b", re.M)  # where a notebook's core path ends
_WHAT_WE_LEARNED = re.compile(r"#{1,3} +What we learned", re.I)


def core_cells(nb: nbformat.NotebookNode) -> list[bool]:
    """For each cell, whether it is on the core path: before the first markdown cell that starts with a "## Go deeper"
    heading (the section rule of the restart table, ``helpers.core.restarts.in_core_path``), or in the closing "What
    we learned" section (STYLE.md: it stays last and is read by everyone). CorePathError for a Go deeper heading
    inside a cell, which neither this nor the restart table would see."""
    out, deeper = [], False
    last_learned = max((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                        and _WHAT_WE_LEARNED.match(c.source.strip())), default=None)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            heading = GO_DEEPER_HEADING.search(cell.source)
            if heading and cell.source[:heading.start()].strip():
                raise CorePathError(f"cell {index}: its '## {GO_DEEPER}' heading is not the cell's first line; start "
                                    "a markdown cell with it, so the core path and the restart table see it")
            deeper = deeper or bool(heading)
        if index == last_learned:
            deeper = False
        out.append(not deeper)
    return out


def core_path(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook with every Go deeper cell removed: what the workshop runs (``core_cells``'s rule)."""
    out = nbformat.from_dict(nb)
    out.cells = [cell for cell, core in zip(nb.cells, core_cells(nb)) if core]
    return out


def run_notebook(path: Path, out_dir: Path = DEFAULT_OUT, parameters: dict[str, Any] | None = None,
                 timeout_s: int = 1800, progress: bool | None = None, core_only: bool = False) -> NotebookRun:
    """Execute one notebook top to bottom; raise NotebookRunError on the first failing cell. ``progress``: a bar of
    the code cells with the section being run (``workshop run`` shows it; None: only inside a notebook kernel).
    ``core_only``: run the core path alone, every Go deeper cell removed, as the workshop does."""
    from helpers.core.progress import bar

    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    if core_only:
        nb = core_path(nb)
    inject_parameters(nb, parameters or {})
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / path.name
    sections = cell_sections(nb)
    with bar(sum(_is_code(c) for c in nb.cells), path.name, "cell", progress) as shown:
        def started(cell: nbformat.NotebookNode, cell_index: int) -> None:
            if _is_code(cell):
                shown.set_postfix_str(sections[cell_index][:60])

        client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}},
                                timeout_func=lambda cell: cell_timeout_s(cell, timeout_s),
                                record_timing=True,  # silent_long_cells reads each cell's timing
                                on_cell_start=started, on_cell_executed=lambda **_: shown.update(1))
        start = time.monotonic()
        try:
            client.execute()
        except CellExecutionError as err:
            nbformat.write(nb, output)
            raise NotebookRunError(f"{path.name} failed (partial output in {output}):\n{err}") from None
    nbformat.write(nb, output)
    return NotebookRun(path, output, time.monotonic() - start, silent_long_cells(nb))


# A cell that can run longer than this shows progress (issue 13: never waiting blind)
LONG_CELL_S = 5.0
# tqdm's bar as text: "desc:  40%|####      | 4/10 [00:02<00:03, 1.9run/s]", without a total "7run [00:02, ...]",
# or a status line with its elapsed time (the engine's start: "engine tiny-agent: loading weights [00:12]")
_BAR = re.compile(r"\d+%\|.*\| *\d+/\d+|\d+/\d+ \[\d+:\d+|\[\d+:\d\d(:\d\d)?(<|,|\])")
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@dataclass(frozen=True)
class SilentCell:
    """An executed cell that ran long without showing progress: its index, seconds and first line."""

    index: int
    seconds: float
    first_line: str

    def __str__(self) -> str:
        return f"cell {self.index} ran {self.seconds:.0f} s without progress: {self.first_line}"


def cell_seconds(cell: nbformat.NotebookNode) -> float | None:
    """How long an executed code cell ran (s), from the timing nbclient records in its metadata
    (``execution``: iopub.execute_input to shell.execute_reply, the kernel's own timestamps); None without it."""
    from datetime import datetime

    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not start or not end:
        return None
    return (datetime.fromisoformat(end.replace("Z", "+00:00")) -
            datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()


def shows_progress(cell: nbformat.NotebookNode) -> bool:
    """Whether a cell's outputs include a progress display: a tqdm bar, as a widget (its text fallback) or as
    text written to the stream."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            text = output.get("text", "")
        else:
            text = output.get("data", {}).get("text/plain", "")
        if isinstance(text, list):
            text = "".join(text)
        if _BAR.search(text):
            return True
    return False


def silent_long_cells(nb: nbformat.NotebookNode, threshold_s: float = LONG_CELL_S) -> list[SilentCell]:
    """The code cells of an executed notebook that ran longer than ``threshold_s`` without a progress display
    (``shows_progress``); cells without timing metadata are not judged."""
    out = []
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        seconds = cell_seconds(cell)
        if seconds is not None and seconds > threshold_s and not shows_progress(cell):
            first = next((line for line in cell.get("source", "").splitlines() if line.strip()), "")
            out.append(SilentCell(index, seconds, first[:80]))
    return out


def _literal(text: str) -> Any:
    """A value as typed after ``NAME=``: JSON, else a Python literal, else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def split_parameter(pair: str) -> tuple[str, str]:
    """``"N=3"`` -> ``("N", "3")``; ParameterError unless it looks like NAME=VALUE."""
    key, sep, value = pair.partition("=")
    if not sep or not key.isidentifier():
        raise ParameterError(f"-p {pair}: a parameter must look like NAME=VALUE, e.g. -p MAX_MODEL_LEN=1024")
    return key, value


def parse_parameters(pairs: list[str]) -> dict[str, Any]:
    """``["n=3", "profile='cpu'"]`` -> ``{"n": 3, "profile": "cpu"}`` (JSON values, else Python literals, else
    strings), without checking them against a notebook (``check_parameters`` does)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, value = split_parameter(pair)
        out[key] = _literal(value)
    return out


NOT_A_LITERAL = object()  # a default computed by an expression (e.g. ``2 * 1024**3``): any value is taken


def notebook_parameters(nb: nbformat.NotebookNode) -> dict[str, Any]:
    """The names the parameters cell assigns and their defaults (``NOT_A_LITERAL`` for an expression);
    empty for a notebook without a parameters cell."""
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells):
        return {}
    cell = nb.cells[parameters_cell_index(nb)]
    try:
        tree = ast.parse(cell.source)
    except SyntaxError as err:
        raise NotebookRunError(f"the parameters cell does not parse ({err.msg}, line {err.lineno})") from None
    out: dict[str, Any] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            names = [target] if isinstance(target, ast.Name) else list(getattr(target, "elts", []))
            values = [node.value] if isinstance(target, ast.Name) else list(getattr(node.value, "elts", []))
            if len(values) != len(names):  # ``A, B = pair``: names without a readable default
                values = [None] * len(names)
            for name, value in zip(names, values):
                if isinstance(name, ast.Name):
                    try:
                        out[name.id] = NOT_A_LITERAL if value is None else ast.literal_eval(_cpu_value(value))
                    except (ValueError, SyntaxError, TypeError):
                        out[name.id] = NOT_A_LITERAL
    return out


def _cpu_value(value: ast.expr) -> ast.expr:
    """The CPU value of ``by_profile(cpu=..., gpu=...)`` (its type is the parameter's); any other expression as it is."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "by_profile":
        cpu = [k.value for k in value.keywords if k.arg == "cpu"] or value.args[:1]
        if cpu:
            return cpu[0]
    return value


_TYPE_WORDS = {bool: ("true or false", "true/false values"), int: ("a whole number", "whole numbers"),
               float: ("a number", "numbers"), str: ("a string", "strings")}


def _scalar_like(value: Any, kind: type) -> Any:
    """``value`` as a ``kind`` (bool, int, float or str); ValueError when it is not one."""
    if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, bool):
        if kind is bool:
            return value
    elif kind is int and isinstance(value, int):
        return value
    elif kind is float and isinstance(value, (int, float)):
        return float(value)
    elif kind is str and isinstance(value, str):
        return value
    raise ValueError(f"takes {_TYPE_WORDS[kind][0]}")


def _typed_like(value: Any, default: Any) -> Any:
    """``value`` converted to the type of ``default``; ValueError saying which type it takes."""
    kind = type(default)
    if kind in _TYPE_WORDS:
        return _scalar_like(value, kind)
    if kind in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError("takes a list")
        item_kinds = {type(item) for item in default}
        item_kind = next(iter(item_kinds)) if len(item_kinds) == 1 else None
        if item_kind in _TYPE_WORDS:
            try:
                value = [_scalar_like(item, item_kind) for item in value]
            except ValueError:
                raise ValueError(f"takes a list of {_TYPE_WORDS[item_kind][1]}") from None
        return kind(value)
    if kind is dict and not isinstance(value, dict):
        raise ValueError("takes a dict")
    return value  # a dict, or a default of no checkable type (None, an expression)


def coerce_parameter(text: str, default: Any) -> Any:
    """The value of ``NAME=text`` for a parameter whose default is ``default``, of the default's type
    (an int default takes ``"1024"``, not ``"abc"``); ValueError saying which type it takes.

    A string parameter takes the text as typed (``-p MODEL=4`` is the name "4") and ``null`` / ``None``,
    which the notebooks read as "leave this step out".
    """
    value = _literal(text)
    if default is NOT_A_LITERAL or default is None:
        return value
    if isinstance(default, str):
        return value if isinstance(value, str) or value is None else text
    return _typed_like(value, default)


def _show(default: Any) -> str:
    return "an expression" if default is NOT_A_LITERAL else repr(default)


def _unknown_name_message(pair: str, name: str, names_by_notebook: dict[str, dict[str, Any]]) -> str:
    where: dict[str, list[str]] = {}
    for notebook, names in names_by_notebook.items():
        for n in names:
            where.setdefault(n, []).append(notebook)
    same_case = [n for n in where if n.lower() == name.lower()]
    close = same_case or difflib.get_close_matches(name, list(where), 3, 0.8)
    single = len(names_by_notebook) == 1
    message = f"-p {pair}: {name} is not a parameter of " + (
        next(iter(names_by_notebook)) if single else f"any of the {len(names_by_notebook)} notebooks to run")
    if close:
        def shown(n: str) -> str:
            return n if single else f"{n} ({where[n][0] if len(where[n]) == 1 else f'in {len(where[n])} of them'})"

        hint = " Names are case-sensitive." if same_case else ""
        return f"{message}; did you mean {' or '.join(shown(n) for n in close)}?{hint}"
    lines = [f"{notebook}: {', '.join(names) or '(none)'}" for notebook, names in names_by_notebook.items()]
    if single:
        return f"{message}; its parameters: {lines[0].split(': ', 1)[1]}"
    return "\n  ".join([f"{message}; their parameters:", *lines])


def check_parameters(pairs: list[str], notebooks: dict[str, nbformat.NotebookNode]) -> dict[str, dict[str, Any]]:
    """The parameters each notebook gets from ``-p NAME=VALUE`` pairs, typed like its defaults.

    ``notebooks`` maps a name to its read notebook. A parameter goes to every notebook whose parameters
    cell assigns it; ParameterError when a pair lacks ``=``, when no notebook has the name (naming the
    right case or the notebooks' parameters), or when a value does not fit a default's type.
    """
    out: dict[str, dict[str, Any]] = {name: {} for name in notebooks}
    if not pairs:
        return out
    defaults: dict[str, dict[str, Any]] = {}
    for name, nb in notebooks.items():
        try:
            defaults[name] = notebook_parameters(nb)
        except NotebookRunError as err:
            raise ParameterError(f"{name}: {err}") from None
    for pair in pairs:
        key, text = split_parameter(pair)
        having = [name for name in notebooks if key in defaults[name]]
        if not having:
            raise ParameterError(_unknown_name_message(pair, key, defaults))
        for name in having:
            default = defaults[name][key]
            try:
                out[name][key] = coerce_parameter(text, default)
            except ValueError as err:
                raise ParameterError(f"-p {pair}: {key} in {name} {err} (its default is {_show(default)}), "
                                     f"got {text!r}") from None
    return out


PREDICTION = re.compile(r"^MY_PREDICTION\s*=", re.M)  # a code cell that asks for the attendee's prediction


def python_source(source: str) -> str:
    """A code cell's Python: IPython's ``%`` and ``!`` lines left out."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))


def _bound_and_read(tree: ast.AST) -> tuple[set[str], list[tuple[str, int]]]:
    """The names a cell binds at top level (assignments, imports, defs, loop and with targets, walrus) and the names
    it reads (name, line) that a function, class or comprehension does not bind itself."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    read = [(n.id, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return bound, read


def undefined_names(nb: nbformat.NotebookNode) -> list[str]:
    """A sentence per name a code cell reads that no cell at or above it binds (nor Python's builtins): run on
    ``core_path(nb)``, the names the core path needs from a Go deeper cell. A name bound anywhere in a cell counts
    for the whole cell (a check for order across cells, not within one)."""
    import builtins

    known = set(dir(builtins)) | {"display", "get_ipython", "In", "Out", "_"}
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(python_source(cell.source))
        except SyntaxError as err:
            problems.append(f"cell {index}: does not parse ({err.msg})")
            continue
        bound, read = _bound_and_read(tree)
        known |= bound
        for name, line in read:
            if name not in known:
                problems.append(f"cell {index} line {line}: {name!r} is read but no cell at or above binds it")
    return problems
