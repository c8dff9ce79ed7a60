"""The trainer's side of metrics.jsonl: token counts across ranks, memory and GPU use, and the callback that
writes one `MetricsRecord` per logged step (rank 0), logs it and exports it as the job's Prometheus figures."""

from __future__ import annotations

import logging
import os
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from documents.metrics import MetricsRecord
from workloads.common.job_metrics import CpuMeter, JobMetricsFile
from workloads.train.metrics_export import record_figures

log = logging.getLogger("documents.metrics")


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
    """Appends step, loss, lr, grad norm, tokens/s, step time, padding efficiency, memory (and GPU or CPU util)
    to metrics.jsonl, and puts each record in the job's metrics file (removed when training ends)."""

    def __init__(self, path: Path, counter: TokenCounter, job_metrics: JobMetricsFile | None = None) -> None:
        self.path = path
        self.counter = counter
        self.job_metrics = job_metrics or JobMetricsFile(None, "none", "train")
        self.last_time = time.perf_counter()
        self.last_step = 0
        self.cpu = CpuMeter()

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self.last_time = time.perf_counter()
        self.last_step = state.global_step
        self.cpu = CpuMeter()

    def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self.job_metrics.remove()

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
            tokens_per_second = round(real / elapsed, 2) if elapsed > 0 else None
            steps, self.last_step = state.global_step - self.last_step, state.global_step
            util = gpu_utilization()
            fields.update({
                "loss": logs["loss"],
                "lr": logs.get("learning_rate"),
                "grad_norm": logs.get("grad_norm"),
                "tokens_per_second": tokens_per_second,
                "tokens": real,
                "padding_efficiency": round(real / processed, 4) if processed else None,
                "memory_mb": round(peak_memory_mb(), 1),
                "gpu_util": util,
                "cpu_util": self.cpu.read() if util is None else None,
                "step_time_s": round(elapsed / steps, 3) if steps > 0 else None,
                "tokens_per_second_per_device": round(tokens_per_second / args.world_size, 2)
                if util is not None and tokens_per_second is not None else None,
            })
        if "eval_loss" in logs:
            fields["eval_loss"] = logs["eval_loss"]
        record = MetricsRecord.model_validate(fields)
        if not state.is_world_process_zero:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(record.line())
        self.job_metrics.update(record_figures(record))
        shown = record.model_dump(exclude={"version", "step"}, exclude_none=True)
        log.info("step %d/%d %s", state.global_step, state.max_steps,
                 " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()))
