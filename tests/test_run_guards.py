"""`ftstack` against careless input and concurrent use: odd stack files, a damaged pipeline state file, two runs
of one stack at once (real local Slurm), Ctrl-C while waiting. Everything through the real console entry."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STACK = """config:
  soperator-finetune:target: local
  soperator-finetune:clusterName: guard
  soperator-finetune:pipeline:
    runConfig: workloads/configs/t.json
"""
STAGE = """#!/usr/bin/env bash
set -euo pipefail
{body}
"""


def as_in_a_terminal() -> None:
    """SIGINT as a shell's foreground command has it (default action, not blocked), whatever the pytest worker
    that starts the command ignores or blocks: Python keeps an inherited SIG_IGN (so `nohup ... &` stays immune to
    Ctrl-C), and a blocked signal stays blocked across exec."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ftstack(repo: Path, *args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "infra.commands.cli", *args], cwd=repo, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=as_in_a_terminal,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, **kwargs)


def signal_masks(pid: int) -> str:
    """The process's ignored, blocked and caught signal masks (hex, bit 1 is SIGINT) from /proc."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return " ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt", "State")))


def finished(proc: subprocess.Popen, timeout: float | None = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def make_repo(root: Path, stack_text: str = STACK, train_body: str = "true") -> Path:
    (root / "Pulumi.yaml").write_text("name: soperator-finetune\nruntime: python\n")
    (root / "stacks").mkdir()
    (root / "stacks" / "Pulumi.guard.yaml").write_text(stack_text)
    jobs = root / "workloads" / "jobs"
    jobs.mkdir(parents=True)
    (root / "workloads" / "__init__.py").write_text("")
    (root / "documents").mkdir()
    (root / "documents" / "__init__.py").write_text("")
    (root / "planning").mkdir()
    (root / "planning" / "__init__.py").write_text("")
    (root / "workloads" / "configs").mkdir()
    for stage in ("prepare", "readiness", "train", "eval"):
        (jobs / f"{stage}.sbatch").write_text(STAGE.format(body=train_body if stage == "train" else "true"))
    # the stub jobs never read the model, but ftstack run checks that a local dir: source is a model folder
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}")
    config = {"name": "t", "paths": {"root": "work"}, "model": {"source": f"dir:{root / 'model'}"},
              "data": {"source": "sample", "rows": 10}}
    (root / "workloads" / "configs" / "t.json").write_text(json.dumps(config))
    (root / "work" / "results").mkdir(parents=True)
    return root


@pytest.mark.parametrize("text,problem", [
    ("- soperator-finetune:target\n- local\n", "must be a mapping"),
    ("just a string\n", "must be a mapping"),
    ("config:\n  - a\n", "'config' must be a mapping"),
])
def test_stack_file_that_is_not_a_mapping_is_named(tmp_path: Path, text: str, problem: str) -> None:
    repo = make_repo(tmp_path, text)
    code, _, err = finished(ftstack(repo, "plan", "--stack", "guard"))
    assert code != 0 and "Traceback" not in err, err
    assert "Pulumi.guard.yaml" in err and problem in err, err


def test_misspelled_namespace_is_refused_naming_the_key(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, STACK + "  soperator-finetun:clusterName: typo\n")
    code, _, err = finished(ftstack(repo, "plan", "--stack", "guard"))
    assert code != 0 and "Traceback" not in err, err
    assert "soperator-finetun:clusterName" in err and "soperator-finetune" in err, err


def test_plan_with_a_missing_run_config_is_one_clear_error(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, STACK.replace("t.json", "missing.json"))
    code, _, err = finished(ftstack(repo, "plan", "--stack", "guard"))
    assert code != 0 and "Traceback" not in err, err
    assert "missing.json" in err, err


@pytest.mark.parametrize("stages,problem", [
    ({"train": {"stage": "train", "outs": {"state": "RUNNING"}}}, "stages.train.outs"),
    ({"train": {"stage": "train", "outs": {"job_id": ["12"]}}}, "job_id"),
    ({"train": {"outs": {"job_id": "12"}}}, "stages.train.stage"),
])
def test_damaged_state_file_is_named_not_a_key_error(tmp_path: Path, stages: dict, problem: str) -> None:
    repo = make_repo(tmp_path)
    state = repo / ".local" / "pipeline" / "guard.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"stack": "guard", "stages": stages}))
    for command in ("status", "run"):
        code, _, err = finished(ftstack(repo, command, "--stack", "guard"))
        assert code == 1 and "Traceback" not in err and "KeyError" not in err, err
        assert str(state) in err and problem in err, err


@pytest.mark.slurm
def test_second_run_of_a_stack_says_who_holds_it_and_ctrl_c_leaves_jobs_running(slurm: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path, train_body="sleep 600")
    first = ftstack(repo, "run", "--stack", "guard", "--wait", env={"SLURM_CONF": slurm})
    state = repo / ".local" / "pipeline" / "guard.json"
    while not (state.exists() and "eval" in json.loads(state.read_text()).get("stages", {})):
        assert first.poll() is None, first.communicate()
        time.sleep(0.5)
    train_job = json.loads(state.read_text())["stages"]["train"]["outs"]["job_id"]
    try:
        second = ftstack(repo, "run", "--stack", "guard", env={"SLURM_CONF": slurm})
        code, _, err = finished(second)
        assert code == 1 and "Traceback" not in err, err
        assert f"pid {first.pid}" in err and "ftstack run" in err, err
        assert json.loads(state.read_text())["stages"]["train"]["outs"]["job_id"] == train_job

        # waited for however long the machine takes: were it deaf to SIGINT, pytest's timeout shows these masks
        print(f"ftstack run --wait before SIGINT: {signal_masks(first.pid)}")
        first.send_signal(signal.SIGINT)
        code, _, err = finished(first, timeout=None)
        assert code == 130 and "Traceback" not in err, err
        assert "keep running" in err and "ftstack run --stack guard --wait" in err and "ftstack status" in err, err
        squeue = subprocess.run(["squeue", "-h", "-j", train_job, "-o", "%T"], capture_output=True, text=True,
                                env={**os.environ, "SLURM_CONF": slurm})
        assert squeue.stdout.strip() in ("PENDING", "RUNNING"), squeue
    finally:
        if first.poll() is None:
            first.kill()
        ids = [s["outs"]["job_id"] for s in json.loads(state.read_text())["stages"].values()]
        subprocess.run(["scancel", *ids], env={**os.environ, "SLURM_CONF": slurm}, capture_output=True)
