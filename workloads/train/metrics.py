"""The training metrics document: one `MetricsRecord` JSON line per logged step, and the loss-curve PNG.

`MetricsRecord` is the one definition of a `metrics.jsonl` line; the trainer writes it through
`workloads.train.metrics_callback`, the operator's side reads the file with `infra.documents.read_metrics`.
New figures are new optional fields. No torch here: `ftstack` imports this module.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from workloads.common.atomic import atomic_file, write_text_atomic

log = logging.getLogger("workloads.train.metrics")

METRICS_VERSION = 1
METRICS_NAME = "metrics.jsonl"
"""the file's name in the run's train_run_dir."""


class MetricsRecord(BaseModel):
    """One logged optimizer step: training figures (a `loss` step), the eval loss (an eval step), or both."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = METRICS_VERSION
    step: int
    epoch: float
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = None
    """real (non-padding) tokens per second over every rank since the previous record."""
    tokens: int | None = None
    """real tokens over every rank since the previous record."""
    padding_efficiency: float | None = None
    memory_mb: float | None = None
    gpu_util: float | None = None
    cpu_util: float | None = None
    """rank 0's CPU time over wall time and its cores since the previous record, in percent (no GPU)."""
    step_time_s: float | None = None
    """wall time of one optimizer step, averaged since the previous record."""
    tokens_per_second_per_gpu: float | None = None
    eval_loss: float | None = None
    job_id: str | None = None
    """the Slurm job that wrote the record: a resubmitted job's progress ignores its predecessors' lines."""

    def line(self) -> str:
        return self.model_dump_json(exclude_none=True) + "\n"


def read_metrics(path: Path) -> list[MetricsRecord]:
    """This run's records so far; a line torn by a crash is skipped with a warning (the node-side reader,
    used to resume and plot; the operator's side uses infra.documents.read_metrics, which is strict)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(MetricsRecord.model_validate_json(line))
        except ValidationError:
            log.warning("%s: skipping a torn line", path)
    return rows


def truncate_metrics(path: Path, step: int) -> None:
    """Keep only records up to `step` (the checkpoint a run resumes from), so resumed steps are not doubled."""
    kept = [r for r in read_metrics(path) if r.step <= step]
    write_text_atomic(path, "".join(r.line() for r in kept))


def plot_loss(metrics: Path, png: Path) -> None:
    """Loss (and eval loss) against optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics)
    train = [(r.step, r.loss) for r in rows if r.loss is not None]
    evals = [(r.step, r.eval_loss) for r in rows if r.eval_loss is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        ax.plot(*zip(*train), marker=".", label="train loss")
    if evals:
        ax.plot(*zip(*evals), marker="o", label="eval loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (assistant tokens)")
    ax.set_title(f"Training loss: {metrics.parent.name}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_file(png) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
