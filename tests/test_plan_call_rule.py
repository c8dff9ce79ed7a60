"""Node counts, GPU counts and placements come from the planner only (issue 60 item 4): outside planning/ no module
calls `worker_shape`, `train_nodes`, `decide_placement`, `fastest_nodes` or `choose_nodes`; the chain, the price, the
utilization month, the comparison, the policy pack and the trainer read the plan (or planning.job_check, planning.
layouts) instead. Calls are found in the code, by name or attribute, imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECIDERS = {"worker_shape", "train_nodes", "decide_placement", "fastest_nodes", "choose_nodes"}
OUTSIDE = ("infra", "workloads", "policies", "documents", "bench")


def calls(paths: list[Path]) -> dict[str, set[str]]:
    """Decider -> `file:line` of every call of it in `paths`."""
    found: dict[str, set[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in DECIDERS:
                found.setdefault(name, set()).add(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_walk_finds_the_planners_own_calls() -> None:
    """train_nodes is gone (the planner's train request takes the placement's nodes); the others are the planner's."""
    inside = calls(sorted((ROOT / "planning").rglob("*.py")))
    assert set(inside) == DECIDERS - {"train_nodes"}, f"the deciders called inside the planner: {sorted(inside)}"


def test_no_module_outside_the_planner_decides_nodes_gpus_or_placement() -> None:
    outside = calls(sorted(p for top in OUTSIDE for p in (ROOT / top).rglob("*.py")))
    assert not outside, f"decided outside planning/: {outside}"
