"""The cost model's estimate of a run's training wall time on a stack (training's time limit follows from it)."""

from __future__ import annotations

from pathlib import Path

from documents.run_config import RunConfig
from infra.config import StackConfig
from infra.cost.price import price_stack
from infra.runs.measured import price_inputs


def estimated_train_hours(stack: StackConfig, run: RunConfig, repo_root: Path) -> float | None:
    """Training's wall hours as `price_stack` estimates them (the stack's stored measurements included); None
    where it has no estimate (the local stack, no throughput)."""
    training = price_stack(stack, price_inputs(stack, repo_root), repo_root, run=run).training
    return training.wall_hours if training is not None else None
