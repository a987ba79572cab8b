"""The shape of the package: floors that import only downwards, rooms beside them with their own rules, no
cycle, and arithmetic that never reaches for the engine (helpers/README.md draws the plan).

Imports are read from the source: every ``import`` statement, in functions and under ``if TYPE_CHECKING:``
too (a type-only import is still a dependency a reader has to follow). There is no exemption list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
# What each subpackage may import besides itself: the floors (core -> hardware -> engine -> measure and planning ->
# evals -> lessons -> cli) and the rooms beside them (tiny, lab, cluster). Each subpackage's docstring says the same.
ALLOWED = {
    "core": set(),
    "hardware": {"core"},
    "tiny": {"core"},
    "planning": {"core", "hardware"},
    "cluster": {"core", "hardware", "planning"},
    "engine": {"core", "hardware", "cluster"},
    "lab": {"core", "engine"},
    "measure": {"core", "hardware", "engine"},
    "evals": {"core", "hardware", "engine", "measure", "planning", "tiny"},
    "lessons": {"core", "hardware", "engine", "measure", "planning", "evals", "tiny"},
    "cli": {"core", "hardware", "engine", "measure", "planning", "evals", "tiny", "lab", "cluster", "lessons"},
}
# Subpackages that compute from numbers they are given: they never start, reach or measure an engine.
PURE = ("core", "planning", "tiny")
PURE_MODULES = ("helpers.hardware.gpus",)  # hardware's tables (the machine probe looks at processes)
ENGINE_OR_NETWORK = {"helpers.engine", "helpers.measure", "httpx", "openai", "aiohttp", "requests", "urllib3"}
LIMITS = {"subpackages": 12, "modules_per_package": 12, "lines_per_module": 600}


def module_name(path: Path) -> str:
    """``helpers/core/settings.py`` -> ``helpers.core.settings``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(HELPERS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, name: str) -> str:
    """``from helpers.core import settings`` names the module helpers.core.settings; other names: the module."""
    candidate = HELPERS.parent.joinpath(*module.split("."), name)
    return f"{module}.{name}" if candidate.with_suffix(".py").is_file() or candidate.is_dir() else module


def imports(source: str) -> set[str]:
    """Every module a source imports, type-only included (top-level names for third-party packages)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(_resolve(node.module, alias.name) if node.module.startswith("helpers") else node.module
                         for alias in node.names)
    return {name if name.startswith("helpers.") else name.split(".")[0] for name in found}


def graph() -> dict[str, set[str]]:
    """Every helpers module (packages as their ``__init__``) -> what it imports."""
    return {module_name(p): imports(p.read_text()) for p in sorted(HELPERS.rglob("*.py"))
            if "__pycache__" not in p.parts and "forced_isa_site" not in p.parts}


def floor(module: str) -> str | None:
    """The subpackage a helpers module lives in (``helpers.engine.local`` -> ``engine``); None for ``helpers``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import that goes where its subpackage may not: ``a -> b (x may not import y)``."""
    wrong = []
    for source, targets in sorted(edges.items()):
        here = floor(source)
        for target in sorted(t for t in targets if t.startswith("helpers.")):
            there = floor(target)
            if here is None or there is None or there == here:
                continue
            if there not in ALLOWED.get(here, set()):
                wrong.append(f"{source} -> {target} ({here} may not import {there})")
    return wrong


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


def reached(edges: dict[str, set[str]], start: str) -> set[str]:
    """Everything ``start`` imports, directly or through other helpers modules."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [n for n in edges.get(name, ()) if n.startswith("helpers.")]
    return set().union(*(edges.get(n, set()) for n in seen)) | seen


def test_the_checks_catch_what_they_are_for():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"x"}}) is None
    fed = {"helpers.core.settings": {"helpers.engine.session"}, "helpers.engine.session": {"helpers.core.settings"},
           "helpers.tiny.corpus": {"helpers.evals.agent"}, "helpers.cli.main": {"helpers.lessons.l01_connect"}}
    assert upward(fed) == ["helpers.core.settings -> helpers.engine.session (core may not import engine)",
                           "helpers.tiny.corpus -> helpers.evals.agent (tiny may not import evals)"]
    assert imports("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from helpers.engine.session import Lab\n"
                   ) == {"typing", "helpers.engine.session"}
    assert imports("from helpers.core import settings, conclusion\n") == {"helpers.core.settings",
                                                                         "helpers.core.conclusion"}


def test_every_subpackage_has_a_rule_and_a_docstring_that_says_what_it_may_import():
    packages = sorted(p.parent.name for p in HELPERS.glob("*/__init__.py"))
    assert packages == sorted(ALLOWED)
    for name in packages:
        doc = ast.get_docstring(ast.parse((HELPERS / name / "__init__.py").read_text())) or ""
        assert "import" in doc.lower(), f"helpers/{name}/__init__.py: say what it may import"


def test_every_import_points_down_the_floors_or_to_an_allowed_room():
    assert upward(graph()) == []


def test_the_helpers_import_graph_has_no_cycle_type_only_imports_included():
    assert find_cycle(graph()) is None


def test_the_engine_interface_imports_no_backend():
    edges = graph()
    assert not {n for n in edges["helpers.engine.interface"] if n.startswith("helpers.engine.")}
    for backend in ("local", "k8s", "replicas"):
        assert "helpers.engine.session" not in edges[f"helpers.engine.{backend}"]


def test_a_measurement_or_an_eval_takes_an_engine_and_never_connects_one():
    for path in [*sorted((HELPERS / "measure").glob("*.py")), *sorted((HELPERS / "evals").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "helpers.engine.session":
                names = {alias.name for alias in node.names}
                assert "connect" not in names, f"{module_name(path)} imports connect: take a Lab (or an engine) instead"


@pytest.mark.parametrize("package", PURE)
def test_a_pure_subpackage_never_reaches_the_engine_or_the_network(package):
    edges = graph()
    for module in sorted(m for m in edges if floor(m) == package):
        hit = {n for n in reached(edges, module) if n.split(".")[0] != "helpers" and n in ENGINE_OR_NETWORK
               or any(n == p or n.startswith(p + ".") for p in ENGINE_OR_NETWORK if p.startswith("helpers."))}
        assert not hit, f"{module} reaches {sorted(hit)}"


@pytest.mark.parametrize("module", PURE_MODULES)
def test_hardwares_tables_never_reach_the_engine_or_the_network(module):
    hit = {n for n in reached(graph(), module)
           if n in ENGINE_OR_NETWORK or any(n.startswith(p + ".") for p in ENGINE_OR_NETWORK)}
    assert not hit, f"{module} reaches {sorted(hit)}"


def test_the_package_stays_small_enough_to_read():
    packages = [p.parent for p in HELPERS.glob("*/__init__.py")]
    assert len(packages) <= LIMITS["subpackages"]
    assert sorted(p.name for p in HELPERS.glob("*.py")) == ["__init__.py"], "every module lives in a subpackage"
    for package in HELPERS.rglob("__init__.py"):
        modules = [p for p in package.parent.glob("*.py") if p.name != "__init__.py"]
        modules += [p for p in package.parent.iterdir() if (p / "__init__.py").is_file()]
        assert len(modules) <= LIMITS["modules_per_package"], f"{package.parent.name} holds {len(modules)}"
    long = {module_name(p): n for p in HELPERS.rglob("*.py") if (n := len(p.read_text().splitlines())) >
            LIMITS["lines_per_module"]}
    assert long == {}, f"modules over {LIMITS['lines_per_module']} lines: {long}"


def test_every_public_error_of_the_helpers_derives_from_the_one_base_the_cli_catches():
    import importlib
    import inspect
    import pkgutil

    import helpers
    from helpers.core.errors import WorkshopError

    errors = {}
    for info in pkgutil.walk_packages(helpers.__path__, "helpers."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                errors[f"{info.name}.{name}"] = obj
    assert len(errors) >= 15, sorted(errors)  # the walk found the package's errors
    outside = sorted(name for name, cls in errors.items()
                     if not name.rsplit(".", 1)[1].startswith("_") and not issubclass(cls, WorkshopError))
    assert outside == [], f"derive these from helpers.core.errors.WorkshopError: {outside}"
