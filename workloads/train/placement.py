"""Where and how a run trains: the one decision the trainer, the cost estimate, the method comparison, `ftstack
plan` and the preview's model-fits policy all make through `decide_placement` (pure, no torch at import).

One order, always: the strategy over the ranks first (`workloads.train.parallelism.decide_parallelism`: DDP while a
replica fits `memory_fraction` of the GPU, FSDP over every rank otherwise), then the micro-batch, accumulation and
checkpointing over that strategy's shards (`workloads.train.sizing.plan_batches`). Given a node count the decision
is made for it (the trainer: the nodes Slurm gave it; the policy: the stack's worker set); without one it is the
fewest whole nodes on which it fits (the comparison, the estimate, the policy's advice). A run that forces DDP is
searched as FSDP there, and the placement says so (`needs_sharding`); its config is not rewritten.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from documents.train_plan import Batching, BatchPlan, ParallelismPlan
from workloads.train.memory import GIB
from workloads.train.model_shapes import ModelShape
from workloads.train.parallelism import decide_parallelism
from workloads.train.sizing import DoesNotFit, plan_batches

if TYPE_CHECKING:
    from documents.run_config import RunConfig


class Hardware(BaseModel):
    """What a placement is decided on: one GPU's usable memory (None: CPU) and the GPUs of one node."""

    model_config = ConfigDict(frozen=True)

    gpu_memory_gib: float | None = Field(description="memory of one GPU as PyTorch reports it (infra.catalog)")
    gpus_per_node: int = Field(1, ge=1, description="ranks per node")


class Placement(BaseModel):
    """The decision: nodes, ranks, strategy and the batch plan over them."""

    model_config = ConfigDict(frozen=True)

    nodes: int
    gpus_per_node: int
    plan: ParallelismPlan
    batches: BatchPlan | None
    """None when not even one sequence per micro-batch fits (`why_not` says by how much)."""
    why_not: str | None = None
    needs_sharding: bool = False
    """the run forces DDP and this placement is what FSDP (train.parallelism auto or fsdp) would need."""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def per_gpu_gib(self) -> float:
        return self.plan.per_rank_bytes.get("total", 0) / GIB

    @property
    def fits(self) -> bool:
        return self.plan.fits and self.batches is not None


def _at(run: RunConfig, shape: ModelShape | None, hardware: Hardware, nodes: int, batching: Batching | None,
        configured: str | None) -> Placement:
    plan = decide_parallelism(run, shape, hardware.gpu_memory_gib, nodes * hardware.gpus_per_node, configured)
    batches, why_not = None, None
    try:
        batches = plan_batches(run, shape, hardware.gpu_memory_gib, batching, plan.shards)
    except DoesNotFit as exc:
        why_not = str(exc)
    return Placement(nodes=nodes, gpus_per_node=hardware.gpus_per_node, plan=plan, batches=batches, why_not=why_not,
                     needs_sharding=configured is not None and plan.strategy == "fsdp")


def decide_placement(run: RunConfig, shape: ModelShape | None, hardware: Hardware, nodes: int | None = None,
                     batching: Batching | None = None) -> Placement | None:
    """The run's placement over `nodes` nodes of `hardware`, or (`nodes` None) over the fewest whole nodes on which
    it fits: one when a replica fits, else as many as the fewest FSDP ranks need; None when no node count fits (the
    activations alone are over). `batching` is the resolved batching (default: what the config plans with)."""
    if nodes is not None:
        return _at(run, shape, hardware, nodes, batching, None)
    configured = "fsdp" if run.train is not None and run.train.parallelism == "ddp" else None
    one = _at(run, shape, hardware, 1, batching, configured)
    if one.fits:
        return one
    ranks = one.plan.min_fsdp_ranks
    if ranks is None:
        return None
    found = _at(run, shape, hardware, math.ceil(ranks / hardware.gpus_per_node), batching, configured)
    return found if found.fits else None
