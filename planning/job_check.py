"""The trainer's start-up check of its plan (issue 60 item 2): the job compares the plan's training placement with
what it got (world size, ranks per node, GPU memory as PyTorch reports it, host memory). Where the plan still fits,
it trains as planned; where it does not, it fails naming the plan's figure and the measured one, or, where the plan
allows it (`TrainingPlacement.adaptable`: a micro-batch or recomputation chosen under `auto`; a batching the data
chose), it adapts and says what changed, which the run manifest records. Pure: no torch here."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from documents.run_config import RunConfig
from documents.run_plan import TrainingPlacement
from documents.train_plan import Batching, planned_batching
from planning.memory import GIB
from planning.model_shapes import ModelShape
from planning.placement import Hardware, Placement, decide_placement


class JobHardware(BaseModel):
    """What the job got: torchrun's ranks, this GPU's memory as PyTorch reports it (None: CPU), this node's RAM."""

    model_config = ConfigDict(frozen=True)

    world_size: int = Field(ge=1)
    ranks_per_node: int = Field(ge=1)
    gpu_memory_gib: float | None
    host_memory_gib: float | None

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.ranks_per_node)

    def hardware(self) -> Hardware:
        return Hardware(gpu_memory_gib=self.gpu_memory_gib, gpus_per_node=self.ranks_per_node,
                        host_memory_gib=self.host_memory_gib)


class PlanMismatch(RuntimeError):
    """The hardware the job got cannot train the plan; the message names the plan's figure and the measured one."""


def _shape_checks(planned: TrainingPlacement, got: JobHardware) -> None:
    if planned.world_size != got.world_size or planned.gpus_per_node != got.ranks_per_node:
        raise PlanMismatch(f"the plan trains on {planned.world_size} ranks ({planned.nodes} node(s) x "
                           f"{planned.gpus_per_node}); this job has {got.world_size} ranks ({got.nodes} node(s) x "
                           f"{got.ranks_per_node}): submit it with the plan's request or plan again")


def _as_planned(planned: TrainingPlacement) -> Placement:
    return Placement(nodes=planned.nodes, gpus_per_node=planned.gpus_per_node, plan=planned.parallelism,
                     batches=planned.batches, why_not=planned.why_not, host_bytes_per_node=planned.host_bytes_per_node,
                     host_memory_gib=planned.host_memory_gib)


def _less(measured: float | None, planned: float | None) -> bool:
    return measured is not None and planned is not None and measured < planned


def _adapted(planned: TrainingPlacement, placed: Placement, got: JobHardware, why: str) -> list[str]:
    """What differs between the planned batch plan and `placed`'s; PlanMismatch where the plan does not allow it."""
    if placed.plan.strategy != planned.parallelism.strategy or placed.plan.shards != planned.parallelism.shards:
        raise PlanMismatch(f"{why}: the plan's {planned.parallelism.strategy} over {planned.parallelism.shards} "
                           f"shard(s) does not hold here ({placed.plan.strategy} over {placed.plan.shards}: "
                           f"{placed.plan.reason})")
    if not placed.fits:
        raise PlanMismatch(f"{why}: the plan does not fit here ({placed.why_not or placed.plan.reason}; "
                           f"{placed.host_text()})")
    was, now = planned.batches, placed.batches
    assert now is not None  # fits
    changed = [f for f in ("micro_batch_tokens", "gradient_checkpointing")
               if was is None or getattr(was, f) != getattr(now, f)]
    refused = [f for f in changed if f not in planned.adaptable]
    if refused:
        raise PlanMismatch(f"{why}: {', '.join(refused)} would change from the plan's "
                           f"({', '.join(f'{f} {getattr(was, f, None)} -> {getattr(now, f)}' for f in refused)}), "
                           "which the run config sets")
    return [f"{why}: {f} {getattr(was, f, None)} planned, {getattr(now, f)} here" for f in changed]


def checked_placement(run: RunConfig, shape: ModelShape | None, planned: TrainingPlacement | None,
                      got: JobHardware, batching: Batching | None = None) -> tuple[Placement, list[str]]:
    """The placement the job trains with and what differs from the plan (module docstring); without a planned
    placement (CPU workers, a model the plan could not size), the one decided on what the job got."""
    placed = decide_placement(run, shape, got.hardware(), got.nodes, batching)
    assert placed is not None  # a given node count always yields a placement
    if planned is None:
        return placed, []
    _shape_checks(planned, got)
    why = []
    if _less(got.gpu_memory_gib, planned.gpu_memory_gib):
        why.append(f"GPU memory {got.gpu_memory_gib:.2f} GiB measured, {planned.gpu_memory_gib:.2f} GiB planned")
    planned_batches = planned_batching(run.train.batching) if run.train is not None else None
    if batching is not None and planned_batches is not None and batching != planned_batches:
        why.append(f"batching {batching} chosen from the data, {planned_batches} planned")
    if _less(got.host_memory_gib, planned.host_memory_gib) and placed.host_bytes_per_node is not None \
            and placed.host_bytes_per_node > (got.host_memory_gib or 0) * GIB:
        raise PlanMismatch(f"host memory {got.host_memory_gib:.1f} GiB measured, {planned.host_memory_gib:.1f} GiB "
                           f"planned: {placed.host_text()}")
    if not why:
        return _as_planned(planned), []
    return placed, _adapted(planned, placed, got, "; ".join(why))
