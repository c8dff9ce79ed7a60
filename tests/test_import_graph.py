"""The project's import graph, drawn from the code: no cycle between modules, imports inside functions included; no
in-project import hidden inside a function (the way loops used to be dodged); and the layers: the planner (planning/)
below infra and workloads, program on top (issues 51, 60)."""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("documents", "planning", "infra", "workloads", "policies")


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    in_function: str | None


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, package: str, modules: dict[str, Path]) -> Iterator[str]:
    """The project modules an import statement loads: `from a import b` is module a.b where one exists, else a."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            yield name


def project_imports() -> list[Import]:
    """Every import of a project module by a project module, with the function it sits in (None: module level)."""
    modules = module_files()
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        owner: dict[ast.AST, str] = {}
        for func in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for inner in ast.walk(func):
                owner.setdefault(inner, func.name)
        for node in (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))):
            found += [Import(module, target, node.lineno, owner.get(node))
                      for target in _imported(node, package, modules) if target != module]
    return found


def test_the_walk_sees_the_imports_it_is_meant_to_see() -> None:
    """The walker itself: module- and function-level, absolute and relative, `from package import module`."""
    edges = {(i.source, i.target) for i in project_imports()}
    assert ("infra.cost.price", "infra.plans") in edges
    assert ("infra.dashboard.render", "infra.dashboard.charts") in edges  # from infra.dashboard import charts
    assert ("infra.dashboard.render", "infra.dashboard") not in edges


def test_no_import_cycle_between_modules() -> None:
    graph: dict[str, set[str]] = {}
    for i in project_imports():
        graph.setdefault(i.source, set()).add(i.target)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle (imports inside functions counted): {' -> '.join(error.args[1])}")


def test_no_project_import_inside_a_function() -> None:
    """An import inside a function is kept only for start-up time, and only of a package outside the project."""
    hidden = [f"{i.source}:{i.line} ({i.in_function}) imports {i.target}" for i in project_imports() if i.in_function]
    assert not hidden, hidden


LOWER = {
    "planning": ("documents", "planning"),
}
"""what a folder may import (its own modules included): the planner sees the documents and itself, nothing of infra/
(configs, prices, schedules) or workloads/ (issue 60)."""
NEVER = {
    "infra.config": ("infra.cost", "infra.pipeline", "infra.program", "infra.commands"),
    "infra.cost": ("infra.pipeline", "infra.program", "infra.commands"),
    "infra.environment": ("infra.pipeline", "infra.program", "infra.commands"),
    "infra.pipeline": ("infra.program", "infra.commands"),
}
TOP = ("infra.program", "infra.commands", "infra.__main__", "policies")
"""what may import infra.program: the program's own modules, the commands that run it, the Pulumi entry point and the
policy pack."""


def _inside(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("folder", sorted(LOWER))
def test_a_lower_folder_imports_only_what_lies_below_it(folder: str) -> None:
    offenders = [f"{i.source} imports {i.target}" for i in project_imports()
                 if _inside(i.source, (folder,)) and not _inside(i.target, LOWER[folder])]
    assert not offenders, offenders


@pytest.mark.parametrize("folder", sorted(NEVER))
def test_cost_and_pipeline_do_not_reach_up(folder: str) -> None:
    offenders = [f"{i.source} imports {i.target}" for i in project_imports()
                 if _inside(i.source, (folder,)) and _inside(i.target, NEVER[folder])]
    assert not offenders, offenders


def test_the_program_is_the_top() -> None:
    offenders = [f"{i.source} imports {i.target}" for i in project_imports()
                 if _inside(i.target, ("infra.program",)) and not _inside(i.source, TOP)]
    assert not offenders, offenders
