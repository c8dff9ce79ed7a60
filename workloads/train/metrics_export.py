"""A training `MetricsRecord` as the job's Prometheus figures (see workloads.common.job_metrics)."""

from __future__ import annotations

from workloads.common.job_metrics import JobFigures
from documents.metrics import MetricsRecord


def record_figures(record: MetricsRecord) -> JobFigures:
    """The figures one record sets: a loss step's throughput, step time, loss, utilization and memory, or an
    eval step's loss."""
    on_gpu = record.gpu_util is not None
    return JobFigures(
        **({"device": "gpu"} if on_gpu else {}),
        tokens_per_second=record.tokens_per_second,
        step_seconds=record.step_time_s,
        loss=record.loss,
        eval_loss=record.eval_loss,
        step=record.step,
        utilization_percent=record.gpu_util if on_gpu else record.cpu_util,
        peak_memory_bytes=None if record.memory_mb is None else record.memory_mb * 2**20,
    )
