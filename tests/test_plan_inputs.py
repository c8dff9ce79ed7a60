"""`ftstack plan` on what a user has on disk and types: the tokenized data of a finished `make demo`, a chart
path it cannot write (issue 42, items 2 and 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from documents.run_config import load_run_config
from infra.commands.cli import main

ROOT = Path(__file__).resolve().parents[1]
LOCAL_RUN = ROOT / "workloads/configs/local.json"


def test_plan_counts_the_tokenized_data_on_disk(tmp_path: Path) -> None:
    """The train split as `datasets.save_to_disk` writes it (two shards); the plan, in a process of its own as a
    user runs it (nothing else imported pyarrow.compute), sums its `length` column."""
    from datasets import Dataset

    lengths = [120, 37, 384, 9, 250]
    rows = Dataset.from_dict({"input_ids": [[1] * n for n in lengths], "length": lengths})
    rows.save_to_disk(str(load_run_config(LOCAL_RUN).locate(tmp_path).train_dataset_dir), num_shards=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FTSTACK_"))}
    done = subprocess.run([sys.executable, "-m", "infra.commands.cli", "plan", "--stack", "demo", "--run-config",
                           "workloads/configs/local.json"], cwd=ROOT, env={**env, "FT_ROOT": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"training tokens: {sum(lengths):,} in the tokenized train split at {tmp_path}" in done.stdout


@pytest.mark.parametrize("name, words", [
    ("chart.gif", "name the file .png or .svg (got '.gif')"),
    ("chart", "(got 'no suffix')"),
    ("missing/chart.png", "does not exist"),
])
def test_compare_chart_refuses_what_it_cannot_write(tmp_path: Path, name: str, words: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / name
    with pytest.raises(SystemExit) as stopped:
        main(["plan", "--stack", "h100", "--compare-chart", str(path)])
    assert f"--compare-chart {path}" in str(stopped.value) and words in str(stopped.value)
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_compare_chart_in_an_unwritable_folder_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["plan", "--stack", "h100", "--compare-chart", "/proc/x.png"])
    assert str(stopped.value).startswith("ftstack plan --compare-chart /proc/x.png: not written: ")
