"""Issue 64 item 3: a full disk during a checkpoint save ends in one line naming the checkpoint folder, its
filesystem and the free space, removes the `.staging-<step>` folder, keeps the previous checkpoint and exits 74
(sysexits' EX_IOERR), not 75 (stopped with a checkpoint); train.sbatch requeues after USR1 only when
`python -m workloads.train.launch --config RUN.json --stopped` says the run stopped with its checkpoint.

Probe: the checkpoint folder on a tmpfs that holds one checkpoint and a half, mounted in a private mount namespace
(`unshare -m`, gone with the process); train 4 steps saving every 2, so the save at step 4 fills it:

    unshare -m sh -c 'mount -t tmpfs -o size=N tmpfs CKPT && python -m workloads.train.finetune --config RUN.json'
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from train_fixtures import ROOT, with_train, write_config
from workloads.train import checkpoints
from workloads.train.finetune import train_run
from workloads.train.launch import main as launch

PAGE = 4096


def _pages(folder: Path) -> int:
    """Bytes a tmpfs needs for `folder`'s files: each file rounded up to whole pages."""
    return sum(-(-f.stat().st_size // PAGE) * PAGE for f in folder.rglob("*") if f.is_file())


NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare(1) for a private tmpfs")


def _on_a_full_disk(tiny_prepared, tmp_path: Path, launcher: list[str]):  # noqa: ANN001, ANN202
    """Train 4 steps saving every 2 with the checkpoint folder on a tmpfs of one checkpoint and a half; returns the
    finished process, the folder, its contents copied out after the run, one checkpoint's size and the tmpfs's."""
    sized = with_train(tiny_prepared, tmp_path / "sized", max_steps=2, save_steps=2)
    assert train_run(sized) == 0
    one = _pages(sized.checkpoints_dir / "checkpoint-2")
    size = (one * 3 // 2) // PAGE * PAGE
    run = with_train(tiny_prepared, tmp_path / "full", max_steps=4, save_steps=2, save_total_limit=2)
    folder, after = run.checkpoints_dir, tmp_path / "after"
    folder.mkdir(parents=True)
    config = write_config(run, tmp_path / "full.json")
    script = (f"mount -t tmpfs -o size={size} tmpfs {folder} || exit 99; "
              f"{' '.join(launcher)} -m workloads.train.finetune --config {config}; rc=$?; "
              f"cp -a {folder} {after}; exit $rc")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=900)
    (tmp_path / "full.log").write_text(done.stdout + done.stderr)
    return done, folder, after, one, size, config


@NEEDS_ROOT
def test_a_full_disk_at_a_checkpoint_names_the_folder_removes_the_staging_and_exits_74(
        tiny_prepared, tmp_path: Path) -> None:
    done, folder, after, one, size, config = _on_a_full_disk(tiny_prepared, tmp_path, [sys.executable])
    assert done.returncode == checkpoints.SAVE_FAILED_EXIT, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("finetune: ")]
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"finetune: cannot write checkpoint-4 in {folder}: filesystem {folder} (tmpfs) has ")
    free = re.search(r"has ([\d.]+) (B|KiB|MiB) free of ([\d.]+) (KiB|MiB)", lines[0])
    assert free, lines[0]
    scale = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2}
    assert float(free.group(1)) * scale[free.group(2)] < one
    assert abs(float(free.group(3)) * scale[free.group(4)] - size) <= 0.05 * size
    assert sorted(p.name for p in after.iterdir()) == ["checkpoint-2"]
    assert checkpoints.problem(after / "checkpoint-2") is None
    assert launch(["--config", str(config), "--stopped"]) == 1, "train.sbatch would requeue a failed save"


@NEEDS_ROOT
def test_under_ddp_every_rank_ends_with_the_line_and_none_waits_for_the_other(tiny_prepared, tmp_path: Path) -> None:
    """Two ranks (gloo): rank 0 writes the weights and fails, rank 1 learns it in the agreement that replaced the
    barrier; both end 74 with the line (rank 1's naming an error on another rank), no rank left waiting."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done, folder, after, _, _, _ = _on_a_full_disk(tiny_prepared, tmp_path, torchrun)
    assert done.returncode != 0
    said = re.findall(rf"finetune: cannot write checkpoint-4 in {re.escape(str(folder))}: filesystem "
                      rf"{re.escape(str(folder))} \(tmpfs\) has [^;]+; the save failed with ([^.]+)\.", done.stderr)
    assert len(said) == 2, done.stderr[-3000:]  # the ranks' lines may run together: two writers on one stderr
    assert "an error on another rank" in said, said
    assert len(re.findall(r"exitcode\s*:\s*74", done.stderr)) >= 1, done.stderr[-3000:]
    assert sorted(p.name for p in after.iterdir()) == ["checkpoint-2"]
    assert checkpoints.problem(after / "checkpoint-2") is None
