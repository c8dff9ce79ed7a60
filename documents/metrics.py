"""The training metrics document: one `MetricsRecord` JSON line per logged step, and the loss-curve PNG.

`MetricsRecord` is the one definition of a `metrics.jsonl` line; the trainer writes it through
`workloads.train.metrics_callback` (`MetricsRecord.line`); `read_metrics` is the one parser, strict for a finished
file, lenient (`live`) for the tail of one being written. New figures are new optional fields. No torch here:
`ftstack` imports this module.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, ConfigDict, Field, ValidationError

from documents.atomic import write_text_atomic
from documents.base import DocumentError, Figures, describe

log = logging.getLogger("documents.metrics")

METRICS_VERSION = 1
METRICS_NAME = "metrics.jsonl"
"""the file's name in the run's train_run_dir."""


class MetricsRecord(Figures):
    """One logged optimizer step: training figures (a `loss` step), the eval loss (an eval step), or both."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = METRICS_VERSION
    step: int
    epoch: float
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens_per_second: float | None = Field(None, validation_alias=AliasChoices("tokens_per_second", "tokens_per_s"))
    """real (non-padding) tokens per second over every rank since the previous record (`tokens_per_s` before
    2026-11-25)."""
    tokens: int | None = None
    """real tokens over every rank since the previous record."""
    padding_efficiency: float | None = None
    memory_mb: float | None = None
    gpu_util: float | None = None
    cpu_util: float | None = None
    """rank 0's CPU time over wall time and its cores since the previous record, in percent (no GPU)."""
    step_time_s: float | None = None
    """wall time of one optimizer step, averaged since the previous record."""
    tokens_per_second_per_device: float | None = Field(
        None, validation_alias=AliasChoices("tokens_per_second_per_device", "tokens_per_second_per_gpu"))
    """tokens_per_second over the ranks, on GPU (`tokens_per_second_per_gpu` before 2026-11-25)."""
    eval_loss: float | None = None
    job_id: str | None = None
    """the Slurm job that wrote the record: a resubmitted job's progress ignores its predecessors' lines."""

    def line(self) -> str:
        return self.model_dump_json(exclude_none=True) + "\n"


def read_metrics(text: str | bytes, origin: str, *, live: bool = False) -> list[MetricsRecord]:
    """Every record of a metrics.jsonl; a bad line is an error naming it, unless `live` (the tail of a file
    being written, or a line torn by a crash), where bad lines are skipped with a warning."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    records: list[MetricsRecord] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(MetricsRecord.model_validate_json(line))
        except ValidationError as error:
            if not live:
                raise DocumentError(f"{origin}:{number}: not a metrics record ({describe(error)})") from None
            log.warning("%s:%d: skipping a torn line", origin, number)
    return records


def load_metrics(path: Path) -> list[MetricsRecord]:
    """The records of a run's metrics file on this machine so far (none when absent), read `live`."""
    return read_metrics(path.read_text(encoding="utf-8"), str(path), live=True) if path.is_file() else []


def truncate_metrics(path: Path, step: int) -> None:
    """Keep only records up to `step` (the checkpoint a run resumes from), so resumed steps are not doubled."""
    kept = [r for r in load_metrics(path) if r.step <= step]
    write_text_atomic(path, "".join(r.line() for r in kept))
