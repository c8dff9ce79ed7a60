"""Training metrics: one `MetricsRecord` JSON line per logged step (rank 0), step logs, and the loss-curve PNG.

`MetricsRecord` is the one definition of a `metrics.jsonl` line; the operator's side reads the file with
`infra.documents.read_metrics`. New figures are new optional fields.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, ValidationError
from transformers import TrainerCallback

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
    tokens_per_second_per_gpu: float | None = None
    eval_loss: float | None = None
    job_id: str | None = None
    """the Slurm job that wrote the record: a resubmitted job's progress ignores its predecessors' lines."""

    def line(self) -> str:
        return self.model_dump_json(exclude_none=True) + "\n"


class TokenCounter:
    """Real and processed tokens seen by this rank since the last read."""

    def __init__(self) -> None:
        self.real = 0
        self.processed = 0

    def add(self, real: int, processed: int) -> None:
        self.real += real
        self.processed += processed

    def take_global(self, device: torch.device | str = "cpu") -> tuple[int, int]:
        counts = torch.tensor([self.real, self.processed], dtype=torch.float64, device=device)
        self.real = self.processed = 0
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(counts)
        return int(counts[0]), int(counts[1])


def peak_memory_mb() -> float:
    """Peak GPU memory allocated by this process when on GPU, else its peak resident set."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpu_utilization() -> float | None:
    if not torch.cuda.is_available():
        return None
    try:
        return float(torch.cuda.utilization())
    except Exception:  # noqa: BLE001 - pynvml missing or NVML unavailable
        return None


class MetricsCallback(TrainerCallback):
    """Appends step, loss, lr, grad norm, tokens/s, padding efficiency, memory (and GPU util) to metrics.jsonl."""

    def __init__(self, path: Path, counter: TokenCounter) -> None:
        self.path = path
        self.counter = counter
        self.last_time = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self.last_time = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN201
        logs = logs or {}
        if "loss" not in logs and "eval_loss" not in logs:
            return
        fields: dict[str, float | int | str | None] = {"step": state.global_step, "epoch": round(state.epoch or 0.0, 4),
                                                       "job_id": os.environ.get("SLURM_JOB_ID")}
        if "loss" in logs:
            device = args.device if torch.cuda.is_available() else "cpu"
            real, processed = self.counter.take_global(device)
            now = time.perf_counter()
            elapsed, self.last_time = now - self.last_time, now
            tokens_per_s = round(real / elapsed, 2) if elapsed > 0 else None
            util = gpu_utilization()
            fields.update({
                "loss": logs["loss"],
                "lr": logs.get("learning_rate"),
                "grad_norm": logs.get("grad_norm"),
                "tokens_per_s": tokens_per_s,
                "tokens": real,
                "padding_efficiency": round(real / processed, 4) if processed else None,
                "memory_mb": round(peak_memory_mb(), 1),
                "gpu_util": util,
                "tokens_per_second_per_gpu": round(tokens_per_s / args.world_size, 2)
                if util is not None and tokens_per_s is not None else None,
            })
        if "eval_loss" in logs:
            fields["eval_loss"] = logs["eval_loss"]
        record = MetricsRecord.model_validate(fields)
        if not state.is_world_process_zero:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(record.line())
        shown = record.model_dump(exclude={"version", "step"}, exclude_none=True)
        log.info("step %d/%d %s", state.global_step, state.max_steps,
                 " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()))


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
