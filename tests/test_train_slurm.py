"""train.sbatch on the local Slurm: 2 processes (gloo, FSDP), USR1 mid-run -> checkpoint, self-requeue, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_jobs import job_field, release_requeued, wait_for
from train_fixtures import LOSS_REL_TOL, trained, with_train, write_config

from documents.metrics import load_metrics

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slurm


def requeued_once(run, tmp_path: Path) -> tuple[str, Path]:
    """train.sbatch with `run`; USR1 after three logged steps, the requeued job released and run to the end."""
    config = write_config(run, tmp_path / "run.json")
    log = tmp_path / "train.log"
    env = {**os.environ, "FT_PYTHON": sys.executable, "FT_CODE_DIR": str(ROOT)}
    submit = subprocess.run(
        ["sbatch", "--parsable", f"--output={log}", "--cpus-per-task=2", str(ROOT / "workloads/jobs/train.sbatch"),
         str(config)],
        capture_output=True, text=True, env=env, check=True,
    )
    job = submit.stdout.strip().split(";")[0]
    metrics = run.train_run_dir / "metrics.jsonl"
    try:
        wait_for(lambda: job_field(job, "JobState") != "PENDING", 1200, "the job to start (node busy?)", log)
        wait_for(lambda: len(load_metrics(metrics)) >= 3, 300, "three logged steps", log)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
        wait_for(lambda: job_field(job, "Restarts") == "1", 120, "the job to requeue itself", log)
        release_requeued(job, log)
        wait_for(lambda: job_field(job, "JobState") in ("COMPLETED", "FAILED", "CANCELLED"), 420,
              "the requeued job to finish", log)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    text = log.read_text(errors="replace")
    assert job_field(job, "JobState") == "COMPLETED", text[-4000:]
    assert "requeueing job" in text
    return job, log


def test_requeued_fsdp_training_matches_an_uninterrupted_run(slurm: str, tiny_prepared, tmp_path: Path) -> None:
    """Under FSDP the USR1 checkpoint holds each rank's shards (torch.distributed.checkpoint); the requeued job
    loads them and goes on as if never stopped: every step's loss as in a run without the interruption, each step
    logged once, the attempts in the manifest. (DDP's requeue and resume: tests/test_cluster_training.py, 2 nodes.)"""
    common = {"max_steps": 20, "save_steps": 50, "logging_steps": 1, "procs_per_node": 2, "micro_batch_size": 1,
              "batching": "grouped", "parallelism": "fsdp", "learning_rate": 1e-3}
    straight, _ = trained(with_train(tiny_prepared, tmp_path / "straight", **common), tmp_path, "straight")
    run = with_train(tiny_prepared, tmp_path / "requeued", **common)
    job, log = requeued_once(run, tmp_path)
    manifest = json.loads((run.train_run_dir / "run_manifest.json").read_text())
    first, second = manifest["attempts"]
    assert manifest["parallelism"]["strategy"] == "fsdp" and manifest["status"] == "completed"
    assert manifest["world_size"] == 2 and first["status"] == "interrupted"
    assert 0 < first["global_step"] == second["resumed_from_step"] < 20
    assert second["slurm_restart_count"] == 1 and second["slurm_job_id"] == job
    assert f"resume={run.checkpoints_dir}/checkpoint-{first['global_step']}" in log.read_text(errors="replace")
    saved = run.checkpoints_dir / f"checkpoint-{first['global_step']}"
    assert sorted(p.name for p in (saved / "pytorch_model_fsdp_0").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    logged = [r for r in load_metrics(run.train_run_dir / "metrics.jsonl") if r.loss is not None]
    assert [r.step for r in logged] == list(range(1, 21)), [r.step for r in logged]
    losses = [r.loss for r in logged]
    assert len(losses) == len(straight) == 20
    for step, (a, b) in enumerate(zip(straight, losses), start=1):
        assert b == pytest.approx(a, rel=LOSS_REL_TOL), f"step {step} (resumed after {first['global_step']}): {a} vs {b}"
    assert (run.adapter_dir / "adapter_model.safetensors").is_file() and (run.train_run_dir / "loss.png").is_file()
