"""Training throughput measured per GPU model (data: training_throughput.json beside this file), which the cost
model uses for a training run's cost when neither the stack's pricing nor a finished run gives one."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

DATA = Path(__file__).with_name("training_throughput.json")


class MeasuredThroughput(BaseModel):
    """One benchmark figure: real (non-padding) training tokens per second on one GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_model: str = Field(description="catalog GPU model, e.g. 'NVIDIA H100 SXM'")
    device: str = Field(description="the GPU as the benchmark saw it")
    model: str = Field(description="run config model.source the figure is for")
    method: str = Field(description="qlora, lora or full")
    tokens_per_second_per_gpu: float = Field(gt=0)
    mfu_6n: float | None = Field(None, gt=0, le=1)
    setup: str
    date: str
    source: str = Field(description="command or benchmark that produced the figure")


@cache
def measured_throughputs(path: Path = DATA) -> tuple[MeasuredThroughput, ...]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
        return tuple(TypeAdapter(list[MeasuredThroughput]).validate_python(rows))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: invalid training throughput data: {error}") from None


def measured_throughput(gpu_model: str, model: str, method: str) -> MeasuredThroughput | None:
    """The newest figure for this GPU model, model and method, if one was measured."""
    found = [m for m in measured_throughputs() if (m.gpu_model, m.model, m.method) == (gpu_model, model, method)]
    return max(found, key=lambda m: m.date) if found else None
