"""What `ftstack run --wait` shows about a job, against the real local Slurm: the first exception of every
torchrun rank (not torchrun's empty "Root Cause" block), and only this job's training metrics."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from infra.pipeline.slurm import SlurmClient, SlurmJobFailed, first_exceptions

pytestmark = pytest.mark.slurm
WAIT = 300

# Each rank prints its traceback, then exits only once every rank has printed its own: torchrun stops the other
# ranks as soon as one exits, and would otherwise cut a slower rank short before its exception. The wait is for that
# event, with no deadline: a rank still importing on a busy machine is not cut short either (a deadline of 60 s was).
RANK_SCRIPT = """
import os, sys, time
from pathlib import Path
from huggingface_hub.utils import validate_repo_id

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

def print_then_wait_for_every_rank(kind, value, traceback):
    sys.__excepthook__(kind, value, traceback)
    sys.stderr.flush()
    Path(f"failed-{rank}").touch()
    while not all(Path(f"failed-{r}").exists() for r in range(world)):
        time.sleep(0.05)

sys.excepthook = print_then_wait_for_every_rank
print(f"rank {rank} loading the base model", flush=True)
validate_repo_id(f"models//base-{rank}")
"""


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + body)
    path.chmod(0o755)
    return str(path)


def test_failed_torchrun_job_names_each_ranks_first_exception(slurm_client: SlurmClient, tmp_path: Path) -> None:
    (tmp_path / "ranks.py").write_text(RANK_SCRIPT)
    job = slurm_client.submit(
        _script(tmp_path / "train.sh", f"{sys.executable} -m torch.distributed.run --nproc_per_node=2 --tee=3 "
                                       f"--master_port=0 {tmp_path / 'ranks.py'}\n"),
        job_name="ft-train", output=str(tmp_path / "train-%j.out"), workdir=str(tmp_path))
    with pytest.raises(SlurmJobFailed) as err:
        slurm_client.wait(job, timeout=WAIT, progress=None)
    text = str(err.value)
    log = (tmp_path / f"train-{job}.out").read_text()
    assert "Root Cause" in log and "HFValidationError" in log
    for rank in (0, 1):
        assert f"rank {rank}: " in text and f"models//base-{rank}" in text, text
    assert "HFValidationError" in text.split("last lines of its log")[0], text


def test_a_ranks_stdout_inside_its_traceback_is_not_taken_for_the_exception() -> None:
    """torchrun tees each rank's stdout and stderr apart, so a line the rank printed before failing can land between
    its `Traceback` line and the frames (seen in a CI run of the test above: rank 1's "loading" line was reported as
    its error)."""
    log = "\n".join([
        "[default0]:rank 0 loading the base model",
        "[default1]:Traceback (most recent call last):",
        "[default0]:Traceback (most recent call last):",
        '[default0]:  File "ranks.py", line 18, in <module>',
        "[default0]:huggingface_hub.errors.HFValidationError: Repo id must be in the form: 'models//base-0'.",
        "[default1]:rank 1 loading the base model",
        '[default1]:  File "ranks.py", line 18, in <module>',
        "[default1]:huggingface_hub.errors.HFValidationError: Repo id must be in the form: 'models//base-1'.",
        "[default1]:KeyboardInterrupt",
    ])
    found = first_exceptions(log)
    assert found == {
        "rank 0": "huggingface_hub.errors.HFValidationError: Repo id must be in the form: 'models//base-0'.",
        "rank 1": "huggingface_hub.errors.HFValidationError: Repo id must be in the form: 'models//base-1'."}
    assert first_exceptions("Traceback (most recent call last):\n  File \"x\"\nKeyboardInterrupt") == {
        "log": "KeyboardInterrupt"}


def test_progress_reads_only_this_jobs_metrics(slurm_client: SlurmClient, tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 30, "epoch": 1.0, "loss": 0.5, "job_id": "1"}) + "\n"
                       + json.dumps({"step": 31, "epoch": 1.0, "loss": 0.4}) + "\n")
    record = '{"step": 2, "epoch": 0.1, "loss": 1.25, "job_id": "%s"}'
    job = slurm_client.submit(
        _script(tmp_path / "train.sh", f"sleep 2\nprintf '{record}\\n' \"$SLURM_JOB_ID\" >> {metrics}\nsleep 2\n"),
        job_name="ft-train", output=str(tmp_path / "t-%j.out"), workdir=str(tmp_path))
    seen: list[str] = []
    slurm_client.wait(job, timeout=WAIT, progress=seen.append, metrics_path=str(metrics))
    steps = [line for line in seen if "loss" in line]
    assert steps and all("step 2 " in line for line in steps), seen


def test_train_job_refuses_a_checkpoint_folder_a_live_job_is_writing(slurm_client: SlurmClient, tmp_path: Path) -> None:
    """Two train jobs over one checkpoint folder (two stacks sharing a run config): the second stops at once."""
    from documents.run_config import parse_run_config
    from workloads.train.config import train_paths

    root = Path(__file__).resolve().parents[1]
    run = parse_run_config({"name": "shared", "paths": {"root": str(tmp_path / "run")}, "model": {"source": "dir:/m"},
                            "data": {"source": "sample", "rows": 4}, "train": {"max_steps": 1}}, "test")
    config = tmp_path / "run.json"
    config.write_text(run.model_dump_json())
    checkpoints = train_paths(run).checkpoint_dir
    checkpoints.mkdir(parents=True)
    writer = slurm_client.submit(_script(tmp_path / "writer.sh", "sleep 300\n"), job_name="ft-train",
                                 output=str(tmp_path / "w-%j.out"))
    try:
        (checkpoints / ".writer-job").write_text(writer + "\n")
        for _ in range(600):
            if slurm_client.state(writer).state == "RUNNING":
                break
            time.sleep(0.5)
        second = slurm_client.submit(str(root / "workloads" / "jobs" / "train.sbatch"), [str(config)],
                                     job_name="ft-train", output=str(tmp_path / "t-%j.out"), workdir=str(root),
                                     env={"FT_PYTHON": sys.executable, "FT_CODE_DIR": str(root)})
        with pytest.raises(SlurmJobFailed) as err:
            slurm_client.wait(second, timeout=WAIT, progress=None)
        assert f"being written by live job {writer}" in str(err.value), str(err.value)
        assert (checkpoints / ".writer-job").read_text().strip() == writer
    finally:
        slurm_client.cancel(writer)
