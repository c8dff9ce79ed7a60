"""Watching a Slurm job from a test through `scontrol`: a field of the job, waiting on a condition with the job's
log in the failure, and letting a requeued job start at once."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def _env(slurm_conf: Path | None) -> dict[str, str]:
    return {**os.environ, **({"SLURM_CONF": str(slurm_conf)} if slurm_conf else {})}


def job_field(job: str, field: str, slurm_conf: Path | None = None) -> str | None:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, env=_env(slurm_conf)).stdout
    match = re.search(rf"\b{field}=(\S+)", out)
    return match.group(1) if match else None


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
    pytest.fail(f"timed out waiting for {what}; job log:\n{tail}")


def release_requeued(job: str, log: Path, slurm_conf: Path | None = None) -> None:
    """Slurm holds a requeued job back for two minutes (BeginTime) before it may start again; once it is back in
    the queue, let it start in 5 s (an operator's `scontrol update`; the requeue itself is Slurm's). Not at once:
    slurmd refuses a launch whose credential is from the same second as its revocation of the job's previous run
    ("Job credential revoked", seen in CI when released within 0.2 s)."""
    wait_for(lambda: (job_field(job, "JobState", slurm_conf), job_field(job, "Reason", slurm_conf)) == ("PENDING", "BeginTime"),
             180, "the job to be back in the queue", log)
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now+5"], capture_output=True, check=True,
                   env=_env(slurm_conf))
