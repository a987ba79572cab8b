"""Every "What you should see" check of an executed notebook was decided on data (issue 31, part 4).

The CI parameters are the smallest that still execute every should-see check. Two ways a run falls short of that:

- a check printed "cannot tell" (or "not seen") BECAUSE the run had too little data: the detail names it with
  one of the LACK_OF_DATA phrases. "cannot tell" from noise (within the run-to-run spread, a busy machine) is a
  verdict on this run's numbers and allowed; so is a check this path cannot make (the room downloads no such model,
  an endpoint run elsewhere), whose detail names none of these phrases;
- a check in the notebook's source printed nothing: per code cell, the checks that always run (``should_see`` and
  ``should_see_conclusion``, one line each; ``show_conclusions``, at least one) against the checks the cell printed.
  A check in a branch (an ``if`` without the same count on the other side, a loop, ``try``, a function, a
  conditional expression, ``show=`` not a constant) is not counted: ``source_checks`` names it, where and why.

``problems(path)`` lists both for one executed notebook; ``assert_checks_decided(path)`` fails with them. The local
path's tests call it after each notebook (tests/notebook_local.py), the cluster path's in tests/test_k8s_path_notebooks.py.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from helpers.core.lesson import NOT_SEEN, SEEN, UNDECIDED, Check

# What a check's detail says when the run had too little data to decide it, each phrase with where it comes from
# (grep helpers/ for the phrase). Matched case-insensitively in the detail of a "cannot tell" or "not seen" line.
LACK_OF_DATA = (
    "nothing to compare",  # l01 conclude_context_growth (one model call); l03 prefill (one prompt length), kv_cache
    #   (no prompt length), batching (no gauge sample, no steady pace), interference (no gap overlapped the prefill);
    #   l04 conclude_dense_vs_moe (a model not measured at a batch); l07 SLO goodput (no request met both SLOs) and
    #   price (fewer than two targets met); l08 structured TPOT (no answer of two or more tokens); 08's baseline
    #   cell ("one run: nothing to compare")
    "too few",  # l01 conclude_stream ("too few tokens to time"); l06 verdicts ("too few drafts to read them")
    "fewer than two",  # l06 cost batching_conclusion ("fewer than two concurrencies measured"); l07 price
    "needs k >= 2",  # l06 verdicts k_conclusion ("the conditional acceptance needs k >= 2 with drafts at every position")
    "not measured in both",  # l07 control ("not measured in both sweeps")
    "not measured at both",  # l06 verdicts trend_conclusion ("not measured at both concurrencies")
    "was not measured",  # l06 lowest_concurrency_conclusion; l04 ("was not measured (see above)"); l08
    #   kv_capacity_check ("was not measured in this run"); measure/routing affinity and later turns
    "not measured.",  # l03 interference _judge, l04 conclude_dense_vs_moe, l06 method_conclusion: no verdict at all
    "proposed nothing",  # l06 aligned_vs_misaligned ("a draft proposed nothing"), l06 cost ("no prediction")
    "the formula was not",  # l06 formula_conclusion ("... proposed drafts in this run: the formula was not tested")
    "at this sample size",  # l06 lossless: the test had no power at LOSSLESS_SAMPLES
    "none counted",  # l06 lossless_pair: no drafts over the samples
    "no quantized checkpoint was measured",  # l05 size_check
    "no quantized configuration was measured",  # l05 speed_conclusion
    "left out by the parameters",  # l05 kv_check (the KV-cache dtype was not started at these parameters)
    "before the kill threshold",  # measure/failover not_killed (07's survival: no replica was killed)
    "no failure run",  # l07 ScaleOutRun.survival without a failure run
)

CHECKS = ("should_see", "should_see_conclusion")  # one printed line each
SHOW_ALL = "show_conclusions"  # one line per conclusion: at least one
_MARKS = {outcome: str(Check("", outcome, "")).split("\n  ", 1)[1] for outcome in (SEEN, NOT_SEEN, UNDECIDED)}
_PRINTED = re.compile(r"^What you should see: (?P<claim>.*)\n  (?P<mark>" + "|".join(map(re.escape, _MARKS.values()))
                      + r")(?:: (?P<detail>.*))?$", re.M)


@dataclass(frozen=True)
class Printed:
    """One check as a cell printed it."""

    cell: int
    claim: str
    outcome: str  # SEEN, NOT_SEEN or UNDECIDED
    detail: str


@dataclass(frozen=True)
class Uncounted:
    """A check in the source whose printing depends on the run: not counted, and why."""

    cell: int
    line: int
    call: str
    why: str

    def __str__(self) -> str:
        return f"cell {self.cell} line {self.line}: {self.call} {self.why}"


def printed_checks(nb: nbformat.NotebookNode) -> list[Printed]:
    """Every "What you should see" line the code cells of an executed notebook printed, in order."""
    outcome_of = {mark: outcome for outcome, mark in _MARKS.items()}
    out = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        text = "".join(o.get("text", "") for o in cell.get("outputs", [])  # print() writes to stdout
                       if o.get("output_type") == "stream" and o.get("name") == "stdout")
        out += [Printed(index, m["claim"], outcome_of[m["mark"]], m["detail"] or "") for m in _PRINTED.finditer(text)]
    return out


def lack_of_data(detail: str) -> str | None:
    """The LACK_OF_DATA phrase a check's detail contains, None when it names none."""
    lower = detail.lower()
    return next((phrase for phrase in LACK_OF_DATA if phrase.lower() in lower), None)


def _name(call: ast.Call) -> str | None:
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return name if name in (*CHECKS, SHOW_ALL) else None


def _shown(call: ast.Call) -> bool | None:
    """True when the call prints, False with ``show=False``, None when ``show=`` is not a constant."""
    show = next((k.value for k in call.keywords if k.arg == "show"), None)
    if show is None:
        return True
    return bool(show.value) if isinstance(show, ast.Constant) else None


class _Counter:
    """The checks that always print in a cell's statements, as (one-line checks, show_conclusions calls), and the
    checks whose printing depends on the run (``uncounted``)."""

    def __init__(self, cell: int) -> None:
        self.cell = cell
        self.uncounted: list[Uncounted] = []

    def _skip(self, node: ast.AST, why: str) -> tuple[int, int]:
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call) and _name(n)):
            self.uncounted.append(Uncounted(self.cell, call.lineno, _name(call), why))
        return 0, 0

    def expression(self, node: ast.AST) -> tuple[int, int]:
        """The checks an expression always prints: none inside a lambda, a comprehension, a conditional expression
        or the later operands of ``and`` / ``or``."""
        if isinstance(node, ast.Lambda):
            return self._skip(node, "in a lambda")
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return self._skip(node, "in a comprehension")
        if isinstance(node, ast.IfExp):
            return self._skip(node, "in a conditional expression")
        if isinstance(node, ast.BoolOp):
            for later in node.values[1:]:
                self._skip(later, f"after `{type(node.op).__name__.lower()}`")
            return self.expression(node.values[0])
        ones = shows = 0
        if isinstance(node, ast.Call) and _name(node):
            shown = _shown(node)
            if shown is None:
                self.uncounted.append(Uncounted(self.cell, node.lineno, _name(node), "with show= not a constant"))
            elif shown:
                ones, shows = (0, 1) if _name(node) == SHOW_ALL else (1, 0)
        for child in ast.iter_child_nodes(node):
            a, b = self.expression(child)
            ones, shows = ones + a, shows + b
        return ones, shows

    def statements(self, body: list[ast.stmt]) -> tuple[int, int]:
        pairs = [self.statement(s) for s in body]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)

    def statement(self, node: ast.stmt) -> tuple[int, int]:
        if isinstance(node, ast.If):
            test = self.expression(node.test)
            inner = _Counter(self.cell)
            body, orelse = inner.statements(node.body), inner.statements(node.orelse)
            if body != orelse:  # one side prints more checks than the other: which runs depends on the run
                self._skip(ast.Module(body=[*node.body, *node.orelse], type_ignores=[]), "in an if branch")
                return test
            self.uncounted += inner.uncounted  # the same count on both sides: decided whichever runs
            return test[0] + body[0], test[1] + body[1]
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            return self._skip(node, "in a loop")
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            return self._skip(node, "in a try statement")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return self._skip(node, "in a definition")
        if type(node).__name__ == "Match":
            return self._skip(node, "in a match statement")
        if isinstance(node, (ast.With, ast.AsyncWith)):
            pairs = [self.expression(i) for i in node.items] + [self.statements(node.body)]
            return sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        return self.expression(node)


def source_checks(source: str, cell: int = 0) -> tuple[int, int, list[Uncounted]]:
    """(checks that always print one line, ``show_conclusions`` calls that always print at least one, the checks not
    counted, with why) in a code cell's source; (0, 0, []) for a cell that is not Python (a magic, a shell line)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 0, 0, []
    counter = _Counter(cell)
    ones, shows = counter.statements(tree.body)
    return ones, shows, list(dict.fromkeys(counter.uncounted))


def notebook_source_checks(nb: nbformat.NotebookNode) -> tuple[int, int, list[Uncounted]]:
    """``source_checks`` summed over a notebook's code cells."""
    ones = shows = 0
    uncounted: list[Uncounted] = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            a, b, c = source_checks(cell.source, index)
            ones, shows, uncounted = ones + a, shows + b, uncounted + c
    return ones, shows, uncounted


def problems(path: Path, allow: dict[str, str] | None = None) -> list[str]:
    """What an executed notebook's should-see checks fell short of, one sentence each (empty: every check was decided
    on data). ``allow``: claims (a part of the text) that may lack data here, each with the reason."""
    nb = nbformat.read(path, as_version=4)
    allow = allow or {}
    out = []
    printed = printed_checks(nb)
    for check in printed:
        phrase = lack_of_data(check.detail) if check.outcome in (UNDECIDED, NOT_SEEN) else None
        if phrase and not any(part in check.claim for part in allow):
            out.append(f"cell {check.cell}: {check.claim!r} printed {_MARKS[check.outcome]!r} for lack of data "
                       f"({phrase!r}): {check.detail}")
    counts: dict[int, int] = {}
    for check in printed:
        counts[check.cell] = counts.get(check.cell, 0) + 1
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        ones, shows, _ = source_checks(cell.source, index)
        if counts.get(index, 0) < ones + shows:
            kinds = " and ".join(part for part in (
                f"{ones} should_see / should_see_conclusion call(s) that always print one line" if ones else "",
                f"{shows} show_conclusions call(s) that always print at least one" if shows else "") if part)
            out.append(f"cell {index}: the source has {kinds}; the run printed {counts.get(index, 0)} check(s)")
    return out


def assert_checks_decided(path: Path, allow: dict[str, str] | None = None) -> None:
    """Fail, naming each, when an executed notebook's should-see check lacked data or printed nothing."""
    found = problems(Path(path), allow)
    assert not found, (f"{Path(path).name}: should-see checks not decided on this run's data (issue 31: the CI "
                       "parameters must execute every check):\n" + "\n".join(found))
