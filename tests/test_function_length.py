"""No function over 60 lines in the project's code, infra/, planning/, workloads/, documents/, policies/ and bench/
(issue 51, widened from workloads/train and workloads/serve by issue 61, planning/ by issue 60): a stage is named
steps, as torchtune's recipes keep a trainer's setup apart from its loop. None needed an exception."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("infra", "planning", "workloads", "documents", "policies", "bench")
LIMIT = 60


def long_functions() -> dict[str, int]:
    """`path:function` -> lines, for every function (methods and nested ones included) over LIMIT lines."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > LIMIT:
                        found[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = lines
    return found


def test_no_function_over_sixty_lines() -> None:
    over = long_functions()
    assert not over, f"functions over {LIMIT} lines (split them into named steps): {over}"


def test_the_trainer_is_named_steps() -> None:
    """train_run reads as its steps: under 50 lines, and calling each of them."""
    tree = ast.parse((ROOT / "workloads/train/finetune.py").read_text())
    train_run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train_run")
    assert train_run.end_lineno - train_run.lineno + 1 < 50
    called = {getattr(c.func, "id", None) for c in ast.walk(train_run) if isinstance(c, ast.Call)}
    assert {"decide", "resume_point", "load_and_shard", "start_manifest", "build_trainer", "finish"} <= called
