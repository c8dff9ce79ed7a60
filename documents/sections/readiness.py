"""The `readiness` section of the run config: what the GPU readiness checks expect of every worker node."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from documents.sections.strict import Count, Flag, Number


class ReadinessConfig(BaseModel):
    """Expectations and measurement sizes of `python -m workloads.checks.gpu` (flags override them)."""

    model_config = ConfigDict(extra="forbid")

    expect_gpu_model: str | None = Field(None, description="GPU model of the preset, e.g. 'NVIDIA L40S' or 'H100'")
    expect_gpus_per_node: Count | None = Field(None, ge=0, description="GPUs every node must have")
    expect_gpu_memory_gib: Number | None = Field(None, gt=0, description="memory per GPU as the preset states it")
    expect_cuda: str | None = Field(None, description="CUDA version of the stack's images (X.Y[.Z]): torch's "
                                    "CUDA build must match its X.Y")
    allow_cpu: Flag = Field(False, description="pass on a node without GPUs (the local stack)")
    allow_drained_nodes: Flag = Field(
        False, description="go on although the partition has nodes Soperator's active checks drained "
                           "([node_problem]/[hardware_problem] reasons); they are reported, not refused",
    )
    interconnect: Literal["infiniband", "ethernet"] | None = Field(
        None, description="fabric between nodes; None detects InfiniBand from /sys/class/infiniband"
    )
    max_temperature_c: Number = Field(85.0, gt=0, description="hottest a GPU may be before the run")
    matmul_size: Count = Field(8192, ge=64, description="square matrix size of the matmul benchmark")
    bandwidth_mib: Count = Field(1024, ge=1, description="buffer size of the device-memory copy benchmark")
    allreduce_mib: Count = Field(256, ge=1, description="tensor size of the all-reduce benchmark (GPU)")
    iterations: Count = Field(20, ge=1, description="timed repetitions of each benchmark")
    min_busbw_gbs: Number | None = Field(None, gt=0, description="all-reduce bus bandwidth floor; overrides the table")
