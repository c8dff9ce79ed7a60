"""The stack's workers as sizing sees them: the nodes and GPUs the training stages use, and their GPU model."""

from __future__ import annotations

from infra import catalog
from infra.config import StackConfig


def worker_shape(stack: StackConfig) -> tuple[int, int]:
    """(nodes, GPUs per node) the training stages use: every node of the first worker set (or the cluster's) but
    those reserved for serving (`serving.nodes`)."""
    if stack.cluster is not None:
        return stack.cluster.nodes - stack.serving.nodes, stack.cluster.gpus_per_node
    if stack.nodes is None or not stack.nodes.workers:
        return 1, 0
    first = stack.nodes.workers[0]
    return first.size - stack.serving.nodes, catalog.get_preset(first.platform, first.preset).gpus


def stack_gpu_model(cfg: StackConfig) -> str | None:
    """The catalog GPU model of the stack's workers (None for CPU workers or a stack without nodes)."""
    if cfg.nodes is None:
        return None
    return next((g for g in (catalog.get_platform(w.platform).gpu_model for w in cfg.nodes.workers) if g), None)
