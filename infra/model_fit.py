"""Where a run fits on a stack's GPUs: for each GPU worker set, the parallelism the run will use (DDP or FSDP, as
``workloads.train.parallelism.decide_parallelism`` decides it for that set's GPUs), the per-GPU estimate and, when
nothing fits, the smallest node count of that set's preset that does.

The preview's model-fits policy, ``ftstack plan`` and the method comparison (``infra/cost/compare.py``) call these
functions, and the trainer calls the same decision, so the preview and the run agree.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from documents.train_plan import ParallelismPlan
from infra import catalog
from infra.config import StackConfig
from workloads.train.memory import GIB
from workloads.train.model_shapes import ModelShape
from workloads.train.parallelism import decide_parallelism

if TYPE_CHECKING:
    from documents.run_config import RunConfig

class Placement(BaseModel):
    """The plan of a run over `nodes` nodes of `gpus_per_node` GPUs each."""

    model_config = ConfigDict(frozen=True)

    nodes: int
    gpus_per_node: int
    plan: ParallelismPlan

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def per_gpu_gib(self) -> float:
        return per_rank_gib(self.plan)


class WorkerFit(BaseModel):
    """One GPU worker set: the run's plan over all of its GPUs and, when that does not fit, the smallest that does."""

    model_config = ConfigDict(frozen=True)

    worker_set: str
    gpu_model: str
    gpu_memory_gib: float
    placement: Placement
    smallest: Placement | None
    """when the stack's set does not fit: the fewest nodes of its preset that do (FSDP where the run forces DDP);
    None when no node count does."""

    @property
    def fits(self) -> bool:
        return self.placement.plan.fits

    def describe(self) -> str:
        p = self.placement
        where = (f"worker set {self.worker_set} ({p.nodes} x {p.gpus_per_node} {self.gpu_model}, "
                 f"{self.gpu_memory_gib:g} GiB each)")
        head = f"{where}: {p.plan.strategy} over {_gpus(p.gpus)}, ~{p.per_gpu_gib:.1f} GiB per GPU"
        if self.fits:
            return f"{head}: fits ({p.plan.reason})"
        verdict = f"{head}: does not fit ({p.plan.reason})"
        if self.smallest is None:
            return f"{verdict}; no node count of this preset fits"
        s = self.smallest
        advice = " with train.parallelism auto or fsdp" if p.plan.configured == "ddp" else ""
        return (f"{verdict}; the smallest that fits is {s.nodes} node(s), {_gpus(s.gpus)}{advice}: {s.plan.strategy}, "
                f"~{s.per_gpu_gib:.1f} GiB per GPU")


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def per_rank_gib(plan: ParallelismPlan) -> float:
    """The plan's estimated peak of one GPU."""
    return plan.per_rank_bytes.get("total", 0) / GIB


def with_parallelism(run: RunConfig, parallelism: str) -> RunConfig:
    return run.model_copy(update={"train": run.train.model_copy(update={"parallelism": parallelism})})


def place(run: RunConfig, shape: ModelShape, gpu_memory_gib: float, nodes: int, gpus_per_node: int) -> Placement:
    plan = decide_parallelism(run, shape, gpu_memory_gib, nodes * gpus_per_node)
    return Placement(nodes=nodes, gpus_per_node=gpus_per_node, plan=plan)


def smallest_placement(run: RunConfig, shape: ModelShape, gpu_memory_gib: float,
                       gpus_per_node: int) -> Placement | None:
    """The fewest nodes of `gpus_per_node` GPUs on which the run's plan fits: one when a replica fits, else as
    many as the fewest FSDP ranks need; a run that forces DDP is tried with FSDP (more nodes never shrink a
    replica). None when no rank count fits (the activations alone are over)."""
    if run.train.parallelism == "ddp":
        run = with_parallelism(run, "fsdp")
    one = place(run, shape, gpu_memory_gib, 1, gpus_per_node)
    if one.plan.fits:
        return one
    ranks = one.plan.min_fsdp_ranks
    if ranks is None:
        return None
    return place(run, shape, gpu_memory_gib, math.ceil(ranks / gpus_per_node), gpus_per_node)


def worker_fits(cfg: StackConfig, run: RunConfig, shape: ModelShape) -> list[WorkerFit]:
    """The run on each GPU worker set of the stack, over all of that set's GPUs."""
    found = []
    for w in cfg.nodes.workers if cfg.nodes is not None else []:
        platform = catalog.get_platform(w.platform)
        if not platform.is_gpu:
            continue
        gpus_per_node = w.shape.gpus
        placement = place(run, shape, platform.gpu_memory_gib, w.size, gpus_per_node)
        smallest = None
        if not placement.plan.fits:
            smallest = smallest_placement(run, shape, platform.gpu_memory_gib, gpus_per_node)
        found.append(WorkerFit(worker_set=w.name, gpu_model=platform.gpu_model or "",
                               gpu_memory_gib=platform.gpu_memory_gib,
                               placement=placement, smallest=smallest))
    return found
