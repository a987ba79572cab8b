"""The shape of the package: data flows one way, and the arithmetic never reaches for the engine.

Imports are read from the source (every ``import`` statement, in functions too, except those under
``if TYPE_CHECKING:``, which only type checkers run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
# Modules that compute or draw from numbers they are given: they never start, reach or measure an engine.
PURE = ("comparison", "conclusion", "cost", "gpus", "memory", "roofline", "plots", "vllm_args", "quant_formats",
        "chat_format", "generation_loop", "cli_args", "acceptance", "lesson", "kv_reuse", "token_price")
ENGINE_OR_NETWORK = {"helpers.engine", "helpers.local_engine", "helpers.k8s_engine", "helpers.session",
                     "helpers.loadgen", "helpers.server_metrics", "httpx", "openai", "aiohttp", "requests", "urllib3"}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path) -> set[str]:
    """Every module a source file imports at run time (top-level names for third-party packages)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "helpers":
                found.update(f"helpers.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name if name.startswith("helpers.") else name.split(".")[0] for name in found}


def graph() -> dict[str, set[str]]:
    return {f"helpers.{p.stem}": imports(p) for p in HELPERS.glob("*.py") if p.stem != "__init__"}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the helpers modules, as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node], _ = 1, path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in edges:
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(edges):
        if start not in state and (cycle := walk(start)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"x"}}) is None


def test_the_helpers_import_graph_has_no_cycle():
    assert find_cycle(graph()) is None


def test_the_engine_interface_imports_no_backend():
    assert not imports(HELPERS / "engine.py") & {"helpers.local_engine", "helpers.k8s_engine", "helpers.session"}
    for backend in ("local_engine", "k8s_engine"):
        assert "helpers.session" not in imports(HELPERS / f"{backend}.py")


@pytest.mark.parametrize("module", PURE)
def test_a_math_or_plot_module_never_reaches_the_engine_or_the_network(module):
    edges = graph()
    seen, todo = set(), [f"helpers.{module}"]
    while todo:  # everything it imports, directly or through other helpers
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [n for n in edges.get(name, ()) if n.startswith("helpers.")]
    reached = set().union(*(edges.get(n, set()) for n in seen)) | seen
    assert not reached & ENGINE_OR_NETWORK, f"helpers.{module} reaches {sorted(reached & ENGINE_OR_NETWORK)}"
