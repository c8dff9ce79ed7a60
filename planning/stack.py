"""What the planner reads of a stack: its worker sets (platform, preset, size, price terms), an existing cluster's
nodes, the nodes reserved for serving with their partitions, the housekeeping partition and the pricing section.
`infra.config.StackConfig.plan_stack` makes it from a stack file; the trainer makes one from the nodes it got when a
run is submitted by hand without a plan."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planning import catalog
from planning.prices import PricingConfig


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlanWorkerSet(_Frozen):
    """One worker set: its machines, its node count and what its node-hour costs."""

    name: str
    platform: str
    preset: str
    size: int = Field(gt=0)
    preemptible: bool = False
    elastic: bool = False
    """ephemeral nodes on a node group that gives nodes back (priced by the hour in the utilization month)."""
    boot_disk_type: str = "NETWORK_SSD"
    boot_disk_gib: int = Field(0, ge=0)

    @property
    def shape(self) -> catalog.Preset:
        return catalog.get_preset(self.platform, self.preset)


class ExistingNodes(_Frozen):
    """An existing Slurm cluster's workers as its stack describes them."""

    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(ge=0)
    cpus_per_node: int = Field(gt=0)
    memory_gib_per_node: float = Field(gt=0)
    gpu_memory_gib: float | None = None
    """one GPU's memory as PyTorch reports it, where known (the trainer's own plan); None: no placement planned."""


class PlanStack(_Frozen):
    stack: str
    target: Literal["nebius", "local", "cluster"]
    workers: list[PlanWorkerSet] = []
    cluster: ExistingNodes | None = None
    serving_nodes: int = Field(0, ge=0)
    """workers of the first set (or of the cluster) reserved for serving, in their own partition."""
    serving_partition: str = "serve"
    training_partition: str = "main"
    housekeeping_partition: str | None = None
    """where the environment build runs on a nebius stack (the system nodes' slurmd), with its CPUs."""
    housekeeping_cpus: int | None = None
    pricing: PricingConfig = PricingConfig()

    @property
    def serving_on(self) -> bool:
        return self.serving_nodes > 0
