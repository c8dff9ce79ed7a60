"""`python -m workloads.checks.gpu` on this CPU-only machine, the torch measurements, and readiness.sbatch on Slurm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infra.pipeline.slurm import SlurmClient, SlurmJobFailed
from workloads.checks import gpu, measure
from serve_process import free_port
from documents.readiness_report import ReadinessReport

ROOT = Path(__file__).resolve().parents[1]
LOCAL_CONFIG = ROOT / "workloads" / "configs" / "local.json"
REPORT_KEYS = {"version", "ok", "created_at", "slurm_job_id", "world_size", "backend", "interconnect", "config", "floors", "nodes",
               "measurements", "allreduce", "checks", "failures"}


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)


def test_cpu_only_fails_without_allow_cpu(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r.json"
    assert gpu.main(["--json-out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert set(report) == REPORT_KEYS and report["version"] == 1
    ReadinessReport.model_validate(report)
    assert not report["ok"] and report["failures"][0].startswith("gpu_present")
    assert report["nodes"][0]["gpus"] == [] and report["nodes"][0]["source"] == "none"
    assert "readiness: FAIL" in capsys.readouterr().out


def test_cpu_only_passes_with_allow_cpu(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "r.json"
    assert gpu.main(["--allow-cpu", "--json-out", str(out), "--expect-gpus-per-node", "8"]) == 0
    report = json.loads(out.read_text())
    assert report["ok"] and report["failures"] == [] and report["world_size"] == 1
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["gpu_present"] == "skip" and statuses["allreduce_busbw"] == "skip"
    assert report["config"]["expect_gpus_per_node"] == 8
    assert [p.name for p in out.parent.iterdir()] == ["r.json"]


def test_run_config_sets_report_path_and_flags_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FT_ROOT", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    args = gpu.parse_args(["--config", str(LOCAL_CONFIG), "--allow-cpu", "--matmul-size", "128"])
    cfg, out = gpu.settings(args)
    assert out == tmp_path / "results" / "readiness-4242.json"
    assert cfg.allow_cpu and cfg.matmul_size == 128
    with pytest.raises(ValueError, match="matmul_size"):
        gpu.settings(gpu.parse_args(["--matmul-size", "3"]))


def test_measurements_run_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert measure.matmul_tflops(cpu, torch.float32, 64, 3) > 0
    assert measure.memory_bandwidth_gbs(cpu, 1, 3) > 0
    assert measure.infiniband_present("/nonexistent") is False


def _strict_config(tmp_path: Path) -> Path:
    """local.json without its `readiness.allow_cpu`, so a node without GPUs fails."""
    config = json.loads(LOCAL_CONFIG.read_text())
    config["readiness"] = {**config.get("readiness", {}), "allow_cpu": False}
    path = tmp_path / "strict.json"
    path.write_text(json.dumps(config))
    return path


def _submit(slurm_client: SlurmClient, tmp_path: Path, *flags: str) -> str:
    return slurm_client.submit(
        str(ROOT / "workloads" / "jobs" / "readiness.sbatch"),
        [str(_strict_config(tmp_path)), *flags],
        job_name="ft-readiness-test",
        output=str(tmp_path / "readiness-%j.out"),
        workdir=str(tmp_path),
        extra_args=["--ntasks-per-node=2"],
        env={"FT_ROOT": str(tmp_path), "FT_PYTHON": sys.executable, "FT_CODE_DIR": str(ROOT)},
    )


@pytest.mark.slurm
def test_readiness_job_passes_on_cpu_with_gloo_allreduce(slurm_client: SlurmClient, tmp_path: Path) -> None:
    job = _submit(slurm_client, tmp_path, "--allow-cpu")
    slurm_client.wait(job, timeout=300, progress=None)
    report = json.loads((tmp_path / "results" / f"readiness-{job}.json").read_text())
    assert report["ok"] and report["slurm_job_id"] == job
    assert (report["world_size"], report["backend"]) == (2, "gloo")
    assert report["allreduce"]["correct"] and report["allreduce"]["busbw_gbs"] > 0
    assert next(c for c in report["checks"] if c["name"] == "allreduce_busbw")["status"] == "info"


@pytest.mark.slurm
def test_readiness_job_fails_without_gpu_and_stops_dependents(slurm_client: SlurmClient, tmp_path: Path) -> None:
    job = _submit(slurm_client, tmp_path)
    marker = tmp_path / "trained"
    train = tmp_path / "train.sh"
    train.write_text(f"#!/bin/bash\ntouch {marker}\n")
    after = slurm_client.submit(str(train), job_name="ft-train-test", dependencies=[job], output=str(tmp_path / "t-%j.out"))
    with pytest.raises(SlurmJobFailed) as err:
        slurm_client.wait_all([job, after], timeout=300, progress=None)
    # srun --kill-on-bad-exit ends a rank still running with SIGTERM once the other exited 1: the job then
    # reports 128 + 15, the highest task code (which one wins is timing: slow machines see 143)
    assert err.value.info.exit_code in (1, 143)
    assert "gpu_present" in str(err.value) and "readiness: FAIL" in str(err.value)
    assert not marker.exists()
    assert not os.path.exists(tmp_path / f"t-{after}.out")


RANK_THEN_THREADS = """
import json, os
from workloads.checks import gpu
report = gpu.run_checks(gpu.settings(gpu.parse_args(["--allow-cpu", "--allow-drained-nodes"]))[0])
threads = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(json.dumps({"ok": report.ok, "world_size": report.world_size, "threads": threads}))
"""


def test_two_ranks_leave_no_gloo_thread_behind_when_the_checks_return(tmp_path: Path) -> None:
    """Two ranks as on two nodes (each its node's local rank 0, so each runs the environment check, which imports
    peft and bitsandbytes). Once run_checks has returned, the process group's gloo threads must be gone: one still
    running when the interpreter exits can abort it ("terminate called without an active exception", exit 134 after
    a passing report: the rehearsal cluster's readiness job, 2026-11-26)."""
    port = free_port()
    ranks = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        env.pop("SLURM_JOB_ID", None)
        ranks.append(subprocess.Popen([sys.executable, "-c", RANK_THEN_THREADS], env=env, cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for rank, proc in enumerate(ranks):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"rank {rank}: {err[-3000:]}"
        result = json.loads(out.strip().splitlines()[-1])
        assert result["ok"] and result["world_size"] == 2
        gloo = [name for name in result["threads"] if "gloo" in name or "tcpstore" in name]
        assert gloo == [], f"rank {rank} still runs {gloo} after destroy_process_group"
