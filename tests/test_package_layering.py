"""Import direction between the packages: policies -> infra -> workloads -> planning -> documents, never back.
documents/ is the bottom layer: it ships to the cluster with the jobs (which have no infra/ there) and is what both
sides agree on, so it imports nothing else from the project; planning/ (the planner) ships with them and sees only
documents/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_packages(package: str) -> dict[str, set[str]]:
    """Top-level package of every import in each module of `package`, by module path."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize(("package", "forbidden"), [("infra", {"policies"}), ("workloads", {"infra", "policies"}),
                                                    ("planning", {"infra", "policies", "workloads"}),
                                                    ("documents", {"infra", "policies", "workloads", "planning"})])
def test_no_import_points_back_up(package: str, forbidden: set[str]) -> None:
    offenders = {module: sorted(names & forbidden) for module, names in imported_packages(package).items()
                 if names & forbidden}
    assert not offenders, f"{package} must not import {sorted(forbidden)}: {offenders}"



def test_the_operator_cli_loads_without_the_training_stack() -> None:
    """`ftstack` reads the workloads' documents (metrics, reports, manifests), never their torch code: importing
    torch, transformers and peft made every command, even `ftstack runs`, take 11 s on the reference machine."""
    import subprocess
    import sys

    probe = ("import sys; from infra.commands.cli import build_parser; build_parser(); "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'peft', 'datasets'}))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout
