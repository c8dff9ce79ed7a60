"""Real Slurm jobs' metrics in a real Prometheus: train.sbatch on the local Slurm, and a job on a node of the
rehearsal cluster, each found by its Slurm job id (`hpc_job`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from cluster_fixtures import Cluster
from infra.monitoring.jobs import job_series, live_figures
from monitoring_fixtures import Monitoring, eventually
from slurm_jobs import job_field, wait_for
from train_fixtures import with_train, write_config
from workloads.common.job_metrics import FILE_NAME, PREFIX, TEXTFILE_DIR_ENV

ROOT = Path(__file__).resolve().parents[1]
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
FIGURES = {"tokens_per_second", "step_seconds", "loss", "step", "utilization_percent", "peak_memory_bytes"}


def job_processes(job: str) -> list[int]:
    """Every process of the Slurm job: those whose environment has its SLURM_JOB_ID (`scontrol suspend`, through
    proctrack/linuxproc, left torchrun's rank running)."""
    marker = f"\0SLURM_JOB_ID={job}\0".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            found = marker in b"\0" + environ.read_bytes()
        except OSError:  # ended meanwhile
            continue
        if found and int(environ.parent.name) != os.getpid():
            pids.append(int(environ.parent.name))
    return pids


def send(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def file_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


@pytest.mark.slurm
def test_a_training_jobs_series_are_found_by_its_slurm_job_id(slurm: str, tiny_prepared, monitoring: Monitoring,
                                                               tmp_path: Path) -> None:
    run = with_train(tiny_prepared, tmp_path, max_steps=100, save_steps=1000, logging_steps=1, procs_per_node=1,
                     micro_batch_size=1)
    config = write_config(run, tmp_path / "run.json")
    log = tmp_path / "train.log"
    env = {**os.environ, "FT_PYTHON": sys.executable, "FT_CODE_DIR": str(ROOT),
           TEXTFILE_DIR_ENV: str(monitoring.textfile_dir)}
    submitted = datetime.now(timezone.utc)
    job = subprocess.run(["sbatch", "--parsable", f"--output={log}", str(ROOT / "workloads/jobs/train.sbatch"),
                          str(config)], capture_output=True, text=True, env=env, check=True).stdout.strip()
    prom = monitoring.textfile_dir / FILE_NAME.format(job_id=job, stage="train")

    def written_or_ended() -> bool:
        text = file_text(prom)
        return all(f"{PREFIX}{name}{{" in text for name in FIGURES) if text else job_field(job, "JobState") in FINISHED

    try:
        # held once its file has every figure, until Prometheus has scraped them: a job that ended between two
        # scrapes (its file goes with it) would leave no series, however short the scrape interval
        eventually(written_or_ended, "the running job's figures in its file", timeout=900)
        assert job_field(job, "JobState") == "RUNNING", "the job ended before its figures were seen:\n" + \
            log.read_text(errors="replace")[-3000:]
        held = job_processes(job)
        send(held, signal.SIGSTOP)
        try:
            eventually(lambda: FIGURES <= set(live_figures(monitoring.url, job)), "the job's figures in Prometheus",
                       timeout=300)
        finally:
            send(held, signal.SIGCONT)
        wait_for(lambda: job_field(job, "JobState") in FINISHED, 600, "the job to finish", log)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    assert job_field(job, "JobState") == "COMPLETED", log.read_text(errors="replace")[-3000:]
    assert not list(monitoring.textfile_dir.glob(f"*_{job}_*.prom")), "the job's metrics file outlived it"
    (found,) = job_series(monitoring.url, [job], submitted - timedelta(minutes=1), datetime.now(timezone.utc))
    assert found.stage == "train"
    assert FIGURES <= set(found.figures)
    assert found.figures["utilization_percent"].labels["device"] == "cpu"
    assert all(p.value > 0 for p in found.figures["tokens_per_second"].points)


@pytest.mark.cluster
def test_a_cluster_jobs_series_come_from_the_node_it_ran_on(local_cluster: Cluster, tmp_path: Path) -> None:
    """The node's TaskProlog gives the job its textfile folder; the controller's Prometheus scrapes that node's
    exporter; the Epilog leaves no file behind."""
    url = (local_cluster.base / "monitoring" / "prometheus.url").read_text().strip()
    log = tmp_path / "job.log"
    script = tmp_path / "job.py"
    script.write_text("import time\n"
                      "from workloads.common.job_metrics import JobFigures, JobMetricsFile, ProcessSampler\n"
                      "f = JobMetricsFile.from_env('eval', 'cluster')\n"
                      "with ProcessSampler(f, interval_s=1):\n"
                      "    f.update(JobFigures(tokens_per_second=5.0))\n"
                      "    time.sleep(20)\n")
    env = {**os.environ, "SLURM_CONF": str(local_cluster.slurm_conf), "PYTHONPATH": str(ROOT)}
    env.pop(TEXTFILE_DIR_ENV, None)
    job = subprocess.run(["sbatch", "--parsable", f"--output={log}", f"--wrap=exec {sys.executable} {script}"],
                         capture_output=True, text=True, env=env, check=True).stdout.strip()
    try:
        figures = eventually(lambda: live_figures(url, job), "the job's series in the cluster's Prometheus", 300)
        wait_for(lambda: job_field(job, "JobState", local_cluster.slurm_conf) in FINISHED, 120, "the job", log)
    finally:
        subprocess.run(["scancel", job], capture_output=True, env=env)
    assert figures["tokens_per_second"] == 5.0 and "utilization_percent" in figures
    node = job_field(job, "NodeList", local_cluster.slurm_conf)
    (series,) = job_series(url, [job], datetime.now(timezone.utc) - timedelta(minutes=5), datetime.now(timezone.utc))
    assert series.figures["tokens_per_second"].labels["slurm_node"] == node in local_cluster.workers
    assert not list((local_cluster.base / "monitoring" / "textfile").rglob(f"*_{job}_*.prom"))
