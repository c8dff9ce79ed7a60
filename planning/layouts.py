"""The layouts `ftstack plan --compare` prices for one model and method on a stack's GPU worker set, decided by the
planner's own placement (infra/cost/method_comparison.py prices them; it decides no node or GPU count itself):

- fit: the fewest GPUs of the stack's model on which ``decide_placement`` fits; with its host memory per node;
- spread: that layout over the whole nodes it needs (all of the stack's where it fits there);
- placed: where it trains on the stack, the fastest of its node counts (``fastest_nodes``), else `spread`;
- chosen: what the trainer takes on the stack (``fastest_nodes`` over every node count, offload included);
- offloaded: FSDP's CPU offload on the fewest whole nodes where it fits, when that is fewer than `fit` needs;
- one_node: the run on one node (an HSDP row's shard group), where `spread` trains FSDP over several nodes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from documents.run_config import RunConfig
from planning import catalog
from planning.memory import GIB
from planning.model_shapes import ModelShape
from planning.placement import Hardware, Placement, decide_placement, host_bytes_per_node, offloaded_placement
from planning.stack import PlanStack
from planning.time_model import fastest_nodes
from planning.workers import worker_shape


@dataclass(frozen=True)
class OnStack:
    """The stack's GPU worker set as the layouts are placed on it."""

    platform: str
    gpu_model: str
    nodes: int
    gpus_per_node: int
    node: Hardware

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def on_stack(stack: PlanStack) -> OnStack | None:
    """The stack's first GPU worker set (its training nodes), None without one."""
    worker = next((w for w in stack.workers if w.shape.gpus), None)
    if worker is None:
        return None
    platform = catalog.get_platform(worker.platform)
    nodes, gpus_per_node = worker_shape(stack)
    return OnStack(platform=worker.platform, gpu_model=platform.gpu_model or "", nodes=nodes,
                   gpus_per_node=gpus_per_node, node=Hardware(gpu_memory_gib=platform.usable_gpu_memory_gib,
                                                              gpus_per_node=gpus_per_node,
                                                              host_memory_gib=worker.shape.ram_gib))


@dataclass(frozen=True)
class Layouts:
    fit: Placement | None
    host_bytes: int | None
    fits_stack: bool
    wall_gpus: int | None
    spread: Placement | None
    placed: Placement | None
    chosen: Placement | None
    offloaded: Placement | None
    one_node: Placement | None


def _offloaded(run: RunConfig, shape: ModelShape, node: Hardware, fit: Placement | None) -> Placement | None:
    if fit is None or fit.plan.strategy != "fsdp":
        return None
    most = math.ceil(fit.gpus / node.gpus_per_node) - 1
    return next((p for n in range(1, most + 1) if (p := offloaded_placement(run, shape, node, n)).fits), None)


def layouts(run: RunConfig, shape: ModelShape, on: OnStack, tokens_per_second_per_gpu: float | None) -> Layouts:
    """The layouts of `run` (one model and method) on the stack's worker set `on` (module docstring)."""
    fit = decide_placement(run, shape, Hardware(gpu_memory_gib=on.node.gpu_memory_gib))
    needed = fit.gpus if fit else None
    host = host_bytes_per_node(run, shape, fit.plan.strategy, on.gpus_per_node) if fit else None
    host_fits = host is not None and host <= (on.node.host_memory_gib or 0) * GIB
    fits_stack = needed is not None and needed <= on.gpus and host_fits
    wall_gpus = on.gpus if fits_stack else (on.gpus_per_node * math.ceil(needed / on.gpus_per_node) if needed else None)
    spread = placed = one_node = None
    if fit is not None and needed and wall_gpus:
        spread = decide_placement(run, shape, on.node, wall_gpus // on.gpus_per_node)
        placed = (fastest_nodes(run, shape, on.node, on.nodes, on.platform, on.gpu_model, tokens_per_second_per_gpu,
                                math.ceil(needed / on.gpus_per_node)) if fits_stack else spread)
        if spread is not None and spread.plan.strategy == "fsdp" and spread.nodes >= 2:
            one_node = decide_placement(run, shape, on.node, 1)
    chosen = fastest_nodes(run, shape, on.node, on.nodes, on.platform, on.gpu_model, tokens_per_second_per_gpu)
    return Layouts(fit=fit, host_bytes=host, fits_stack=fits_stack, wall_gpus=wall_gpus, spread=spread,
                   placed=placed, chosen=chosen, offloaded=_offloaded(run, shape, on.node, fit), one_node=one_node)
