"""Where a run fits on a stack's GPUs: for each GPU worker set, the placement the run trains with on that set's
nodes (``planning.time_model.fastest_nodes``: the fewest nodes where ``decide_placement`` fits, on the catalog's
usable GPU memory and the preset's RAM, more only where the network and offload estimate says they train faster)
and, when no node count of the set fits, the fewest nodes of the set's preset that do. The planner's train request
asks Slurm for the first set's placement's nodes (planning/planner.py).

The planner, the preview's model-fits policy and ``ftstack plan`` call ``worker_fits`` with the throughput of the run's
plan (`RunPlan.size`), so the nodes the run is priced for are the nodes it is placed on.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from documents.run_config import RunConfig
from documents.run_plan import RunPlan
from planning import catalog
from planning.stack import PlanStack
from planning.time_model import fastest_nodes
from planning.model_shapes import ModelShape
from planning.placement import Hardware, Placement, decide_placement


class WorkerFit(BaseModel):
    """One GPU worker set: the run's placement over all of its GPUs and, when that does not fit, the smallest that
    does."""

    model_config = ConfigDict(frozen=True)

    worker_set: str
    gpu_model: str
    gpu_memory_gib: float
    """usable memory of one GPU (catalog.USABLE_GPU_MEMORY)."""
    placement: Placement
    set_nodes: int
    """the nodes of the worker set (the placement trains on as many of them as ``fastest_nodes`` chooses)."""
    smallest: Placement | None
    """when the stack's set does not fit: the fewest nodes of its preset that do (FSDP where the run forces DDP);
    None when no node count does."""

    @property
    def fits(self) -> bool:
        return self.placement.fits

    def describe(self) -> str:
        p = self.placement
        used = f"{p.nodes} of {self.set_nodes}" if p.nodes != self.set_nodes else f"{p.nodes}"
        where = (f"worker set {self.worker_set} ({used} x {p.gpus_per_node} {self.gpu_model}, "
                 f"{self.gpu_memory_gib:g} GiB usable each)")
        head = f"{where}: {p.plan.strategy} over {_gpus(p.gpus)}, ~{p.per_gpu_gib:.1f} GiB per GPU"
        if self.fits:
            return f"{head}: fits ({p.plan.reason}; {p.host_text()})"
        verdict = f"{head}: does not fit ({p.plan.reason}; {p.host_text()})"
        if self.smallest is None:
            return f"{verdict}; no node count of this preset fits"
        s = self.smallest
        advice = " with train.parallelism auto or fsdp" if s.needs_sharding else ""
        return (f"{verdict}; the smallest that fits is {s.nodes} node(s), {_gpus(s.gpus)}{advice}: {s.plan.strategy}, "
                f"~{s.per_gpu_gib:.1f} GiB per GPU")


def planned_throughput(plan: RunPlan | None) -> float | None:
    """The training throughput per GPU the run's plan chose its training nodes at (None: no plan or no throughput)."""
    return plan.tokens_per_second_per_gpu if plan is not None else None


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def worker_fits(cfg: PlanStack, run: RunConfig, shape: ModelShape,
                tokens_per_second_per_gpu: float | None) -> list[WorkerFit]:
    """The run on each GPU worker set of the stack: on the nodes it trains fastest on at the throughput the run is
    priced with (`tokens_per_second_per_gpu`, the plan's: measured where a run measured it), else over all of them
    (the first set's nodes reserved for serving, `serving.nodes`, never train)."""
    found = []
    for index, w in enumerate(cfg.workers):
        size = w.size - (cfg.serving_nodes if index == 0 else 0)
        platform = catalog.get_platform(w.platform)
        if not platform.is_gpu:
            continue
        hardware = Hardware(gpu_memory_gib=platform.usable_gpu_memory_gib, gpus_per_node=w.shape.gpus,
                            host_memory_gib=w.shape.ram_gib)
        placement = (fastest_nodes(run, shape, hardware, size, w.platform, platform.gpu_model or "",
                                   tokens_per_second_per_gpu)
                     or decide_placement(run, shape, hardware, nodes=size))
        smallest = None if placement.fits else decide_placement(run, shape, hardware)
        found.append(WorkerFit(worker_set=w.name, gpu_model=platform.gpu_model or "",
                               gpu_memory_gib=hardware.gpu_memory_gib, placement=placement, set_nodes=size,
                               smallest=smallest))
    return found
