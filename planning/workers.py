"""The stack's workers as sizing sees them: the nodes and GPUs the training stages use, and their GPU model."""

from __future__ import annotations

from planning import catalog
from planning.stack import PlanStack


def worker_shape(stack: PlanStack) -> tuple[int, int]:
    """(nodes, GPUs per node) the training stages use: every node of the first worker set (or the cluster's) but
    those reserved for serving (`serving.nodes`)."""
    if stack.cluster is not None:
        return stack.cluster.nodes - stack.serving_nodes, stack.cluster.gpus_per_node
    if not stack.workers:
        return 1, 0
    first = stack.workers[0]
    return first.size - stack.serving_nodes, first.shape.gpus


def stack_gpu_model(cfg: PlanStack) -> str | None:
    """The catalog GPU model of the stack's workers (None for CPU workers or a stack without nodes)."""
    return next((g for g in (catalog.get_platform(w.platform).gpu_model for w in cfg.workers) if g), None)
