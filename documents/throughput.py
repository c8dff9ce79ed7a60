"""Measured training throughput: one figure per run or bench, with what it was measured on and where it came from.

A `ThroughputMeasurement` is what the cost model prices a training run with. Two sources write them: a finished
training run (`measure_run`, from its metrics records and run manifest, stored with the run's artifacts) and
the GPU benches (rows of `training_throughput.json` beside this file, added by hand from `bench/train_gpu.sh`).
The quantity is always real (non-padding) training tokens per second per device (GPU, or CPU rank where the
run had no GPU), the run's total real tokens over its logged wall time.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from documents.base import DocumentError, describe
from documents.metrics import MetricsRecord
from documents.run_config import parse_run_config
from documents.run_manifest import RunManifest

DATA = Path(__file__).with_name("training_throughput.json")


class ThroughputMeasurement(BaseModel):
    """Real training tokens per second per device, measured once, with its provenance."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    tokens_per_second_per_device: float = Field(
        gt=0, validation_alias=AliasChoices("tokens_per_second_per_device", "tokens_per_second_per_gpu"))
    device_kind: Literal["gpu", "cpu"] = "gpu"
    gpu_model: str | None = Field(None, description="catalog GPU model, e.g. 'NVIDIA H100 SXM'; None on CPU")
    device: str = Field(description="the device as the run or bench saw it")
    devices: int = Field(1, ge=1, description="devices (DDP ranks) the figure was measured over")
    model: str = Field(description="run config model.source the figure is for")
    method: str = Field(description="qlora, lora or full")
    mfu_6n: float | None = Field(None, gt=0, le=1)
    setup: str = ""
    micro_batch_tokens: int | None = Field(None, gt=0, description="tokens per micro-batch it trained with")
    gradient_checkpointing: bool | None = Field(None, description="whether it recomputed activations")
    date: str
    origin: Literal["run", "bench"] = "bench"
    stack: str | None = Field(None, description="the stack whose run measured it")
    run_id: str | None = Field(None, description="the stored run (runs/<stack>/<run_id>) or training job")
    source: str = Field(description="command, bench or run that produced the figure")

    @property
    def basis(self) -> str:
        return "tokens/s per GPU" if self.device_kind == "gpu" else "tokens/s per CPU rank"

    def describe(self) -> str:
        """One line for the cost table: the figure, where it was measured and by what."""
        where = f"run {self.run_id} on stack {self.stack}" if self.origin == "run" else self.source
        return (f"{self.tokens_per_second_per_device:,.4g} {self.basis} measured {self.date} on {self.devices} x "
                f"{self.device} ({where})")


class ThroughputCheck(BaseModel):
    """A run's measured training throughput beside the figure its stack was priced with before the run (an
    estimate, a borrowed figure or an earlier run's): how far off that figure was."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    priced_tokens_per_second_per_gpu: float = Field(gt=0)
    priced_kind: str = Field(description="configured, measured, borrowed or estimated")
    priced_source: str = Field(description="the source line of the figure the stack was priced with")
    measured_tokens_per_second_per_gpu: float = Field(gt=0)
    ratio: float = Field(gt=0, description="measured / priced")

    @classmethod
    def of(cls, priced: float, kind: str, source: str, measured: float) -> ThroughputCheck:
        return cls(priced_tokens_per_second_per_gpu=priced, priced_kind=kind, priced_source=source,
                   measured_tokens_per_second_per_gpu=measured, ratio=round(measured / priced, 4))


@cache
def bench_throughputs(path: Path = DATA) -> tuple[ThroughputMeasurement, ...]:
    """The bench figures kept in the repository."""
    try:
        return tuple(TypeAdapter(list[ThroughputMeasurement]).validate_json(path.read_bytes()))
    except OSError as error:
        raise DocumentError(f"{path}: cannot read training throughput data: {error}") from None
    except ValidationError as error:
        raise DocumentError(f"{path}: invalid training throughput data ({describe(error)})") from None


def run_tokens_per_second(records: list[MetricsRecord], job_id: str | None = None) -> float | None:
    """Real tokens per second over every rank for a whole run: logged tokens over logged time (each record
    covers `tokens` at `tokens_per_second` since the one before), only the records of `job_id` when given."""
    timed = [r for r in records if r.tokens and r.tokens_per_second and (job_id is None or r.job_id in (None, job_id))]
    seconds = sum(r.tokens / r.tokens_per_second for r in timed)
    return sum(r.tokens for r in timed) / seconds if seconds > 0 else None


def measure_run(records: list[MetricsRecord], manifest: RunManifest, *, gpu_model: str | None, stack_name: str,
                run_id: str, source: str) -> ThroughputMeasurement | None:
    """The throughput a finished run measured (None when it logged no timed step)."""
    overall = run_tokens_per_second(records)
    if overall is None:
        return None
    run = parse_run_config(manifest.config, f"{source}: run_manifest.json config")
    device = manifest.device or "unknown device"
    on_gpu = gpu_model is not None or manifest.device_kind == "gpu"
    plan = manifest.batch_plan
    return ThroughputMeasurement(
        tokens_per_second_per_device=round(overall / manifest.world_size, 3),
        device_kind="gpu" if on_gpu else "cpu", gpu_model=gpu_model, device=device, devices=manifest.world_size,
        model=run.model.source, method=run.train.method if run.train else "unknown",
        setup=f"{manifest.nodes} node(s), {manifest.precision}",
        micro_batch_tokens=plan.micro_batch_tokens if plan else None,
        gradient_checkpointing=plan.gradient_checkpointing if plan else None,
        date=(manifest.ended or manifest.started or "")[:10],
        origin="run", stack=stack_name, run_id=run_id, source=source,
    )
