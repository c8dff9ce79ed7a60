"""workloads/serve/ by process (issue 61 item 1): the CPU engine, a process of its own, imports nothing of the
gateway; the launcher's engine planning imports no HTTP code; the shared HTTP module imports nothing else of
workloads.serve. Imports are walked from the code (those inside functions included) and followed through every
project module they load, so that a reach through a shared module counts too."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("documents", "workloads", "infra", "policies", "planning")
HTTP = {"fastapi", "starlette", "httpx", "uvicorn", "workloads.serve.http_shared", "workloads.serve.engine_key"}


@cache
def module_files() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py") if (ROOT / package).is_dir() else []:
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


@cache
def direct_imports(module: str) -> frozenset[str]:
    """What `module` imports: project modules by dotted name (their packages too, as Python loads them) and
    other distributions by top-level name."""
    modules = module_files()
    path = modules[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for name in _names(node, package):
            if name.split(".")[0] not in PACKAGES:
                found.add(name.split(".")[0])
                continue
            while name and name not in modules:
                name = name.rpartition(".")[0]
            while name:
                found.add(name)
                name = name.rpartition(".")[0]
    return frozenset(found - {module})


def reach(module: str) -> set[str]:
    """Everything importing `module` loads, transitively through project modules."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for name in direct_imports(todo.pop()):
            if name not in seen:
                seen.add(name)
                if name in module_files():
                    todo.append(name)
    return seen


def serve_modules(folder: str) -> list[str]:
    return sorted(m for m, p in module_files().items() if p.is_relative_to(ROOT / "workloads/serve" / folder))


def test_the_walk_sees_what_it_is_meant_to_see() -> None:
    """The walker itself, on imports known to be there: module level, inside a function, and through a module."""
    engine = reach("workloads.serve.engine.server")
    assert {"workloads.serve.engine.batching", "workloads.serve.http_shared", "fastapi", "uvicorn"} <= engine
    assert "peft" in reach("workloads.serve.engine.stacked_lora")
    assert "workloads.serve.gateway.state" in reach("workloads.serve.gateway.app")
    assert "fastapi" in reach("workloads.serve.gateway.admin_routes")  # through relay, state and http_shared


@pytest.mark.parametrize("module", serve_modules("engine"))
def test_the_cpu_engine_imports_nothing_of_the_gateway(module: str) -> None:
    other = sorted(n for n in reach(module) if n.startswith(("workloads.serve.gateway", "workloads.serve.launcher",
                                                             "workloads.serve.clients", "workloads.serve.publish")))
    assert not other, f"{module} (the CPU engine, a process of its own) loads {other}"


def test_the_launchers_engine_planning_imports_no_http_code() -> None:
    loaded = reach("workloads.serve.launcher.engine_plan")
    http = sorted(loaded & HTTP | {n for n in loaded if n.startswith("workloads.serve.gateway")})
    assert not http, f"workloads.serve.launcher.engine_plan loads HTTP code: {http}"


@pytest.mark.parametrize("module", ["workloads.serve.http_shared", "workloads.serve.route",
                                    "workloads.serve.token_budget"])
def test_the_shared_modules_import_nothing_of_any_process(module: str) -> None:
    serve = sorted(n for n in reach(module) if n.startswith("workloads.serve.") and n.count(".") >= 2
                   and n.split(".")[2] in ("gateway", "engine", "launcher", "clients", "publish"))
    assert not serve, f"{module} is shared by the serving processes but loads {serve}"
    if module != "workloads.serve.http_shared":
        assert not reach(module) & HTTP, f"{module} is plain data, yet loads {sorted(reach(module) & HTTP)}"


def test_every_serving_module_says_its_process() -> None:
    """Each file of workloads/serve/ sits in its process's folder, or is one of the few pieces they share."""
    shared = {"__init__", "http_shared", "route", "token_budget", "request", "auth", "engine_key", "registry", "adapter_files",
              "publish"}
    loose = sorted(p.stem for p in (ROOT / "workloads/serve").glob("*.py") if p.stem not in shared)
    assert not loose, f"modules of workloads/serve/ in no process's folder: {loose}"
