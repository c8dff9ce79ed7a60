"""A job's live figures as Prometheus metrics, through the node exporter's textfile collector.

A job writes one `.prom` file (the Prometheus text exposition format) into the folder named by
FTSTACK_METRICS_TEXTFILE_DIR, replacing it atomically at each update and removing it when the job ends. Every
series carries the Slurm job id as `hpc_job`, the label Soperator's DCGM exporter puts on a job's GPU series
(dcgm-exporter's HPC job mapping, fed by Soperator's map_job_dcgm.sh prolog), so `{hpc_job="<id>"}` selects a
job's series locally and on the cloud. Without the variable (cloud nodes), or with a folder that cannot be
written, the job runs unchanged: the writer logs one warning and does nothing. Standard library and pydantic
only: this runs on nodes that have only the bundle.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from documents.atomic import write_text_atomic

log = logging.getLogger("workloads.job_metrics")

TEXTFILE_DIR_ENV = "FTSTACK_METRICS_TEXTFILE_DIR"
JOB_LABEL = "hpc_job"
"""the Slurm job id label, named as Soperator's DCGM job mapping names it."""
PREFIX = "ftstack_job_"
FILE_NAME = "ftstack_job_{job_id}_{stage}.prom"
"""a job's file in the textfile folder (the Slurm epilog of the local clusters removes `ftstack_job_<id>_*`)."""


class JobFigures(BaseModel):
    """What a job reports at one moment; a field left None is not exported. Each field is the metric
    `ftstack_job_<field>` (see HELP)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: Literal["cpu", "gpu"] = "cpu"
    """what utilization_percent measures (its `device` label)."""
    tokens_per_second: float | None = None
    step_seconds: float | None = None
    loss: float | None = None
    eval_loss: float | None = None
    step: int | None = None
    utilization_percent: float | None = None
    peak_memory_bytes: float | None = None

    def updated(self, newer: JobFigures) -> JobFigures:
        """These figures with every figure `newer` sets replaced."""
        return self.model_copy(update=newer.model_dump(exclude_none=True, exclude_unset=True))


HELP: dict[str, str] = {
    "tokens_per_second": "Real (non-padding) tokens per second of the job (training: over every rank since the "
                         "previous update; evaluation: generation).",
    "step_seconds": "Wall time of one optimizer step, averaged since the previous update.",
    "loss": "Training loss (assistant tokens) at the last logged step.",
    "eval_loss": "Evaluation loss at the last evaluation.",
    "step": "Last logged optimizer step.",
    "utilization_percent": "Utilization of the job's device (label device: gpu, or cpu: CPU time of the process "
                           "that writes the file over wall time and the cores it may use), in percent.",
    "peak_memory_bytes": "Peak memory of the process that writes the file: GPU memory allocated on GPU, else its "
                         "resident set.",
    "last_update_timestamp_seconds": "Unix time of the job's last update.",
}
"""metric name after PREFIX -> HELP text: the JobFigures fields, then the update time."""


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f'{name}="{_label_value(value)}"' for name, value in labels.items())


def exposition(figures: JobFigures, labels: Mapping[str, str]) -> str:
    """The text exposition of `figures`: one gauge per figure that is set, with `labels` (JobMetricsFile's: the
    Slurm job id as JOB_LABEL, stage, run; utilization adds `device`), then the time of the update."""
    values = {**figures.model_dump(exclude={"device"}), "last_update_timestamp_seconds": time.time()}
    lines = []
    for name, value in values.items():
        if value is None:
            continue
        full = PREFIX + name
        series = {**labels, "device": figures.device} if name == "utilization_percent" else labels
        lines += [f"# HELP {full} {HELP[name]}", f"# TYPE {full} gauge",
                  f"{full}{{{_labels(series)}}} {_number(float(value))}"]
    return "\n".join(lines) + "\n"


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class CpuMeter:
    """CPU utilization of this process (every thread) since the previous read, in percent of its cores."""

    def __init__(self) -> None:
        self._last = (time.monotonic(), time.process_time())

    def read(self) -> float | None:
        wall, cpu = time.monotonic(), time.process_time()
        (last_wall, last_cpu), self._last = self._last, (wall, cpu)
        if wall <= last_wall:
            return None
        return round(100.0 * (cpu - last_cpu) / (wall - last_wall) / cpu_count(), 1)


def peak_rss_bytes() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


class JobMetricsFile:
    """The job's `.prom` file, holding the latest value of each figure; every method is a no-op without a
    textfile folder, and after the first error (logged once)."""

    def __init__(self, directory: Path | None, job_id: str, stage: str, run: str | None = None) -> None:
        self.labels = {JOB_LABEL: job_id, "stage": stage, **({"run": run} if run else {})}
        self.path = directory / FILE_NAME.format(job_id=job_id, stage=stage) if directory else None
        self.figures = JobFigures()
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, stage: str, run: str | None = None) -> JobMetricsFile:
        """This Slurm job's file (SLURM_JOB_ID) in $FTSTACK_METRICS_TEXTFILE_DIR; inactive when either is unset."""
        directory, job_id = os.environ.get(TEXTFILE_DIR_ENV), os.environ.get("SLURM_JOB_ID")
        return cls(Path(directory) if directory and job_id else None, job_id or "none", stage, run)

    def update(self, figures: JobFigures) -> None:
        """Take the figures `figures` sets and rewrite the file (temporary file, then rename)."""
        with self._lock:
            self.figures = self.figures.updated(figures)
            if self.path is None:
                return
            try:
                write_text_atomic(self.path, exposition(self.figures, self.labels))
            except OSError as error:
                log.warning("job metrics off: cannot write %s (%s); the job goes on without them",
                            error.filename or self.path, error.strerror or error)
                self.path = None

    def remove(self) -> None:
        """The job is over: its series end (Prometheus marks them stale at the next scrape)."""
        with self._lock:
            if self.path is None:
                return
            try:
                self.path.unlink(missing_ok=True)
            except OSError as error:
                log.warning("cannot remove %s: %s", self.path, error.strerror or error)
            self.path = None


class ProcessSampler:
    """While open, refreshes the file's CPU utilization and peak memory of this process every `interval_s`
    (for stages without steps of their own, such as evaluation); removes the file on close."""

    def __init__(self, file: JobMetricsFile, interval_s: float = 5.0) -> None:
        self.file, self.interval_s = file, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-metrics", daemon=True)
        self._meter = CpuMeter()

    def sample(self) -> None:
        self.file.update(JobFigures(utilization_percent=self._meter.read(), peak_memory_bytes=peak_rss_bytes()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> ProcessSampler:
        if self.file.path is not None:
            self.sample()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.file.remove()
