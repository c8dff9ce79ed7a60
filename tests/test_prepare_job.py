"""The prepare stage: orchestrated from a run config, and as a real job on the local Slurm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datasets import load_from_disk

from conftest import tiny_run_config
from documents.run_config import RunConfig
from workloads.prepare import run

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "workloads" / "jobs" / "prepare.sbatch"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def test_prepared_outputs_follow_the_contract(tiny_prepared: RunConfig) -> None:
    config = tiny_prepared
    assert (config.base_model_dir / "manifest.json").is_file()
    assert config.raw_data_file.is_file() and config.conversations_file.is_file()
    train_lines = config.train_jsonl.read_text().splitlines()
    test_lines = config.test_jsonl.read_text().splitlines()
    assert len(train_lines) + len(test_lines) == 64 and not set(train_lines) & set(test_lines)
    for directory, lines in ((config.train_tokenized_dir, train_lines), (config.test_tokenized_dir, test_lines)):
        dataset = load_from_disk(str(directory))
        assert dataset.column_names == ["input_ids", "attention_mask", "labels", "length", "prompt_length", "row"]
        assert len(dataset) == len(lines) and max(dataset["length"]) <= config.data.max_length
        assert json.loads((directory / "manifest.json").read_text())["params"]["max_length"] == config.data.max_length


def test_second_run_changes_nothing(tiny_prepared: RunConfig) -> None:
    config = tiny_prepared
    outputs = [config.base_model_dir, config.raw_data_file, config.conversations_file, config.train_jsonl,
               config.test_jsonl, config.train_tokenized_dir, config.test_tokenized_dir]
    before = [p.stat().st_ino for p in outputs]
    run(config)
    assert [p.stat().st_ino for p in outputs] == before


def test_file_source_converts_a_local_file_with_row_limit(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "finance.jsonl"
    source.write_text("".join(json.dumps({"system": "", "user": f"Question {i}?", "assistant": f"Answer {i}."}) + "\n"
                              for i in range(30)))
    config = tiny_run_config(tmp_path / "run", tiny_model_dir, rows=20, source=f"file:{source}")
    summary = run(config)
    assert summary.convert.rows_kept == 20 and summary.split.train_rows == 18 and summary.split.test_rows == 2
    assert not config.raw_data_file.exists()


def _write_config(path: Path, config: RunConfig) -> Path:
    path.write_text(config.model_dump_json(indent=2, exclude_none=True))
    return path


def _sbatch(tmp_path: Path, config: Path) -> tuple[str, Path]:
    log = tmp_path / "prepare-%j.out"
    env = {**os.environ, "FT_PYTHON": sys.executable, "FT_CODE_DIR": str(ROOT)}
    env.pop("FT_ROOT", None)
    done = subprocess.run(["sbatch", "--parsable", f"--output={log}", "--cpus-per-task=1", str(SCRIPT), str(config)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    job = done.stdout.strip().split(";")[0]
    return job, tmp_path / f"prepare-{job}.out"


def _wait(job: str, timeout: float = 900) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = subprocess.run(["scontrol", "show", "job", job, "-o"], capture_output=True, text=True).stdout
        state = next((f.split("=", 1)[1] for f in record.split() if f.startswith("JobState=")), "")
        if state in ENDED:
            return state
        time.sleep(1)
    subprocess.run(["scancel", job])
    pytest.fail(f"prepare job {job} did not finish within {timeout} s")


@pytest.mark.slurm
def test_prepare_job_on_local_slurm(slurm: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tiny_run_config(tmp_path / "run", tiny_model_dir, rows=40)
    job, log = _sbatch(tmp_path, _write_config(tmp_path / "run.json", config))
    state = _wait(job)
    assert state == "COMPLETED", log.read_text()[-3000:]
    text = log.read_text()
    assert f"prepare: job {job}" in text and "[5/5] tokenize" in text
    assert len(load_from_disk(str(config.train_tokenized_dir))) + len(load_from_disk(str(config.test_tokenized_dir))) == 40
    assert json.loads((config.base_model_dir / "manifest.json").read_text())["source"] == f"dir:{tiny_model_dir}"


@pytest.mark.slurm
def test_prepare_job_fails_with_the_reason_in_its_log(slurm: str, tmp_path: Path) -> None:
    config = tiny_run_config(tmp_path / "run", tmp_path / "no-such-model", rows=10)
    job, log = _sbatch(tmp_path, _write_config(tmp_path / "run.json", config))
    assert _wait(job) == "FAILED"
    assert f"error: dir:{tmp_path / 'no-such-model'}: folder not found" in log.read_text()
    assert not config.base_model_dir.exists()
