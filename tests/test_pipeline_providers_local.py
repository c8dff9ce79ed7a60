"""WorkloadBundle and SlurmJob dynamic providers called directly, against this machine and the real local Slurm."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from infra.pipeline.bundle import WorkloadBundleProvider, bundle_files, bundle_hash
from infra.pipeline.jobs import SlurmJobProvider
from infra.pipeline.slurm import SlurmJobFailed

LOCAL = {"kind": "local"}


def _source(root: Path) -> Path:
    pkg = root / "workloads"
    (pkg / "jobs").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    (pkg / "__init__.py").write_text("")
    (root / "documents").mkdir()
    (root / "documents" / "__init__.py").write_text("")
    (root / "planning").mkdir()
    (root / "planning" / "__init__.py").write_text("")
    (pkg / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    jobs = {
        "ok.sbatch": 'echo "ok $* code=$FT_CODE_DIR stage=$STAGE"\n',
        "fail.sbatch": 'echo "prepare failed: bad row 3" >&2\nexit 2\n',
        "sleep.sbatch": "echo sleeping\nsleep 120\n",
        "mark.sbatch": 'touch "$1"\n',
    }
    for name, body in jobs.items():
        (pkg / "jobs" / name).write_text("#!/bin/bash\nset -euo pipefail\n" + body)
        (pkg / "jobs" / name).chmod(0o755)
    return root


def _bundle_props(src: Path, code_root: Path) -> dict:
    return {"source_dir": str(src), "code_root": str(code_root), "transport": LOCAL, "content_hash": bundle_hash(src)}


def test_bundle_hash_ignores_caches_and_tracks_content_and_modes(tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    assert all("__pycache__" not in p.parts for p in bundle_files(src))
    first = bundle_hash(src)
    (src / "workloads" / "__pycache__" / "y.pyc").write_bytes(b"more junk")
    assert bundle_hash(src) == first
    (src / "workloads" / "jobs" / "ok.sbatch").chmod(0o644)
    assert bundle_hash(src) != first
    with pytest.raises(FileNotFoundError, match="not a Python package"):
        bundle_files(tmp_path)


def test_bundle_create_diff_update_read_delete(tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    code_root = tmp_path / "jail" / "home" / "shared" / "finetune_code"
    provider = WorkloadBundleProvider()
    props = _bundle_props(src, code_root)
    created = provider.create(props)
    outs = created.outs
    assert outs["uploaded"] and outs["content_hash"] == props["content_hash"]
    assert os.readlink(code_root / "current") == outs["content_hash"]
    assert (code_root / "current" / "workloads" / "jobs" / "ok.sbatch").is_file()
    assert not (code_root / "current" / "workloads" / "__pycache__").exists()

    assert provider.diff(created.id, outs, _bundle_props(src, code_root)).changes is False
    again = provider.update(created.id, outs, _bundle_props(src, code_root)).outs
    assert again["uploaded"] is False and again["path"] == outs["path"]

    (src / "workloads" / "train.py").write_text("print('v2')\n")
    news = _bundle_props(src, code_root)
    diff = provider.diff(created.id, outs, news)
    assert diff.changes and diff.replaces == []
    updated = provider.update(created.id, outs, news).outs
    assert updated["uploaded"] and updated["content_hash"] != outs["content_hash"]
    assert os.readlink(code_root / "current") == updated["content_hash"]
    assert Path(outs["path"]).is_dir(), "old versions stay for queued jobs"
    assert provider.diff(created.id, updated, {**news, "code_root": str(tmp_path / "other")}).replaces == ["code_root"]

    assert provider.read(created.id, updated).outs["content_hash"] == updated["content_hash"]
    provider.delete(created.id, updated)
    assert Path(updated["path"]).is_dir()
    os.rename(updated["path"], updated["path"] + ".gone")
    assert provider.read(created.id, updated).outs["content_hash"] == ""


@pytest.fixture
def bundle(tmp_path: Path) -> dict:
    src = _source(tmp_path / "src")
    return WorkloadBundleProvider().create(_bundle_props(src, tmp_path / "code")).outs


def _job(bundle: dict, slurm: str, tmp_path: Path, script: str, **kw) -> dict:
    return {
        "script": f"workloads/jobs/{script}", "bundle_path": bundle["path"], "fingerprint": bundle["content_hash"],
        "transport": LOCAL, "args": [], "env": {}, "dependencies": [], "job_name": f"ft-{script.split('.')[0]}",
        "output": str(tmp_path / "logs-%j.out"), "extra_args": [], "slurm_env": {"SLURM_CONF": slurm}, "wait": False,
        "wait_timeout": 180, "metrics_path": None, "results_path": str(tmp_path / "results"), "poll_s": 0.5, **kw,
    }


@pytest.mark.slurm
def test_job_create_waits_read_diff_update(bundle: dict, slurm: str, tmp_path: Path) -> None:
    provider = SlurmJobProvider()
    props = _job(bundle, slurm, tmp_path, "ok.sbatch", args=["a b"], env={"STAGE": "prepare"}, wait=True)
    created = provider.create(props)
    outs = created.outs
    assert created.id == outs["job_id"] and (outs["state"], outs["exit_code"]) == ("COMPLETED", 0)
    log = (tmp_path / f"logs-{created.id}.out").read_text()
    assert log.strip() == f"ok a b code={bundle['path']} stage=prepare"
    assert provider.read(created.id, outs).outs["state"] == "COMPLETED"

    assert provider.diff(created.id, outs, props).changes is False
    assert provider.diff(created.id, outs, {**props, "args": ["c"]}).replaces == ["args"]
    assert provider.diff(created.id, outs, {**props, "fingerprint": "0" * 16}).replaces == ["fingerprint"]
    renamed = {k if k != "fingerprint" else "bundle_hash": v for k, v in outs.items()}
    assert provider.diff(created.id, renamed, props).replaces == []
    assert provider.diff(created.id, outs, {**props, "dependencies": ["99"]}).replaces == ["dependencies"]
    soft = provider.diff(created.id, outs, {**props, "wait_timeout": 60})
    assert soft.changes and soft.replaces == []
    assert provider.update(created.id, outs, {**props, "wait_timeout": 60}).outs["job_id"] == created.id


@pytest.mark.slurm
def test_failed_stage_stops_the_chain(bundle: dict, slurm: str, tmp_path: Path) -> None:
    provider = SlurmJobProvider()
    prepare = provider.create(_job(bundle, slurm, tmp_path, "fail.sbatch"))
    marker = tmp_path / "train-ran"
    train_props = _job(bundle, slurm, tmp_path, "mark.sbatch", args=[str(marker)], dependencies=[prepare.id], wait=True)
    with pytest.raises(SlurmJobFailed, match="can never run: DependencyNeverSatisfied"):
        provider.create(train_props)
    state = provider.read(prepare.id, prepare.outs).outs
    assert (state["state"], state["exit_code"]) == ("FAILED", 2)
    assert not marker.exists()


@pytest.mark.slurm
def test_delete_cancels_a_running_job_and_keeps_its_log(bundle: dict, slurm: str, tmp_path: Path) -> None:
    provider = SlurmJobProvider()
    created = provider.create(_job(bundle, slurm, tmp_path, "sleep.sbatch"))
    deadline = time.monotonic() + 180
    while provider.read(created.id, created.outs).outs["state"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    provider.delete(created.id, created.outs)
    assert provider.read(created.id, created.outs).outs["state"] in ("CANCELLED", "COMPLETING")
    assert (tmp_path / f"logs-{created.id}.out").read_text().startswith("sleeping")
    provider.delete(created.id, created.outs)
