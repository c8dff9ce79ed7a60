"""The readiness report rank 0 of the readiness job writes (`<results_dir>/readiness-<job id>.json`).

`ReadinessReport` is the one definition of the document; `workloads.checks` fills it, `read_readiness_report`
reads it on the operator's side.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from documents.base import parse
from documents.sections.readiness import ReadinessConfig

Status = Literal["pass", "fail", "skip", "info"]


class GpuInfo(BaseModel):
    index: int
    uuid: str | None = None
    name: str
    memory_total_mib: float
    temperature_c: float | None = None
    ecc_uncorrected: int | None = None


class NodeInventory(BaseModel):
    hostname: str
    source: Literal["nvml", "nvidia-smi", "none"]
    gpus: list[GpuInfo] = []
    driver_version: str | None = None
    cuda_version: str | None = None
    torch_cuda: str | None = None
    torch_cuda_devices: int = 0


class GpuPerf(BaseModel):
    hostname: str
    rank: int
    device: int
    name: str
    matmul_bf16_tflops: float
    matmul_fp16_tflops: float
    memory_bandwidth_gbs: float


class AllReduceResult(BaseModel):
    backend: str
    world_size: int
    nodes: int
    size_bytes: int
    seconds: float
    algbw_gbs: float
    busbw_gbs: float
    correct: bool


class CheckResult(BaseModel):
    name: str
    status: Status
    node: str | None = None
    gpu: int | None = None
    value: int | float | str | None = None
    threshold: int | float | str | None = None
    unit: str | None = None
    detail: str = ""


class GpuFloors(BaseModel):
    model_config = ConfigDict(extra="forbid")

    matmul_bf16_tflops: float
    matmul_fp16_tflops: float
    memory_bandwidth_gbs: float


class ReadinessFloors(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: dict[str, GpuFloors | None] = {}
    """per measured GPU name; None where the table has no floor for it."""
    busbw_gbs: float


class ReadinessReport(BaseModel):
    """Every check of one readiness job; `ok` is False when any check failed."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    ok: bool
    created_at: str
    slurm_job_id: str | None = None
    world_size: int
    backend: str | None = None
    """torch.distributed backend of the all-reduce; None for one rank."""
    interconnect: Literal["infiniband", "ethernet"]
    config: ReadinessConfig
    floors: ReadinessFloors
    nodes: list[NodeInventory]
    measurements: list[GpuPerf]
    allreduce: AllReduceResult | None = None
    checks: list[CheckResult]
    failures: list[str]
    """one line per failed check (see `check_line`)."""


def read_readiness_report(text: str | bytes, origin: str) -> ReadinessReport:
    return parse(ReadinessReport, text, origin, "readiness report")
