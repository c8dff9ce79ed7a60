"""Issue 54 item 2: one stored run whose `run.json` is truncated beside healthy runs made `ftstack runs` exit 2 listing
nothing and the dashboard show no run. A damaged run is listed as damaged with its path; the others stay usable."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from documents.run_record import RunIndex, write_run_record
from documents.stack_outputs import Cost, StackOutputs, write_stack_outputs
from infra.commands import report, runs
from infra.runs.store import LocalStore, scan_runs

HEALTHY = ("20261101T000000Z-11", "20261102T000000Z-12")
TRUNCATED, OTHERS = "20261103T000000Z-13", "20261104T000000Z-14"
STACK_FILE = """config:
  soperator-finetune:target: local
  soperator-finetune:clusterName: damaged
  soperator-finetune:pipeline:
    runConfig: workloads/configs/local.json
"""


def index(stack: str, run_id: str, day: int) -> RunIndex:
    return RunIndex(stack=stack, run_id=run_id, uploaded_at=f"2026-11-{day:02d}T01:00:00+00:00",
                    started_at=f"2026-11-{day:02d}T00:00:00+00:00", job_ids={"eval": str(10 + day)},
                    perplexity_base=7.0, perplexity_finetuned=5.0 - day / 10)


def fill(store: LocalStore, stack: str) -> dict[str, Path]:
    """Two healthy runs, one whose run.json was cut mid-write, one whose run.json is another run's copy."""
    for day, run_id in enumerate(HEALTHY, start=1):
        store.put_bytes(f"runs/{stack}/{run_id}/run.json", write_run_record(index(stack, run_id, day)).encode())
    whole = write_run_record(index(stack, TRUNCATED, 3))
    store.put_bytes(f"runs/{stack}/{TRUNCATED}/run.json", whole[: len(whole) // 2].encode())
    store.put_bytes(f"runs/{stack}/{OTHERS}/run.json", write_run_record(index(stack, HEALTHY[0], 4)).encode())
    return {run_id: store.root / "runs" / stack / run_id / "run.json" for run_id in (TRUNCATED, OTHERS)}


def test_scan_lists_the_readable_runs_and_names_each_damaged_one(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "artifacts")
    paths = fill(store, "local")
    listing = scan_runs(store, "local")
    assert [r.run_id for r in listing.runs] == list(HEALTHY)
    assert [(d.run_id, d.path) for d in listing.damaged] == [(TRUNCATED, str(paths[TRUNCATED])),
                                                              (OTHERS, str(paths[OTHERS]))]
    truncated, copied = listing.damaged
    assert "not a valid run index" in truncated.reason
    assert f"names run {HEALTHY[0]!r}" in copied.reason and f"stored as run {OTHERS!r}" in copied.reason


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "repo"
    (root / "stacks").mkdir(parents=True)
    (root / "stacks" / "Pulumi.damaged.yaml").write_text(STACK_FILE)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    monkeypatch.chdir(root)
    return root


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ftstack")
    sub = parser.add_subparsers(required=True)
    runs.register(sub)
    report.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_ftstack_runs_lists_the_healthy_runs_and_the_damaged_ones_with_their_paths(
        repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = fill(LocalStore(repo / ".local" / "artifacts"), "damaged")
    assert cli(["runs", "--stack", "damaged"]) == 0
    out = capsys.readouterr().out
    table, _, damaged = out.partition("2 damaged run(s)")
    assert all(run_id in table for run_id in HEALTHY) and TRUNCATED not in table and OTHERS not in table, out
    assert f"{TRUNCATED}: {paths[TRUNCATED]}" in damaged and f"{OTHERS}: {paths[OTHERS]}" in damaged, out

    assert cli(["runs", "--stack", "damaged", "--json"]) == 0
    captured = capsys.readouterr()
    assert [r["run_id"] for r in json.loads(captured.out)] == list(HEALTHY)
    assert str(paths[TRUNCATED]) in captured.err and str(paths[OTHERS]) in captured.err


def test_the_dashboard_shows_the_latest_healthy_run_and_warns_of_the_damaged(
        repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = fill(LocalStore(repo / ".local" / "artifacts"), "damaged")
    outputs = tmp_path / "outputs.json"
    outputs.write_text(write_stack_outputs(StackOutputs(
        stack="damaged", target="local", cluster_name="damaged", slurm_target="local",
        run_config="workloads/configs/local.json",
        cost=Cost(monthly_usd_low=0.0, monthly_usd_high=0.0, hours_per_month=730, pricing_date="2026-11-01"))))
    page = tmp_path / "page"
    assert cli(["report", "--stack", "damaged", "--outputs", str(outputs), "--out", str(page)]) == 0
    html = (page / "index.html").read_text()
    assert f"run {HEALTHY[1]}" in html
    assert "2 stored run(s) damaged" in html and str(paths[TRUNCATED]) in html and str(paths[OTHERS]) in html
    assert str(paths[TRUNCATED]) in capsys.readouterr().err

    assert cli(["report", "--stack", "damaged", "--outputs", str(outputs), "--out", str(page),
                "--run", TRUNCATED]) == 2
    err = capsys.readouterr().err
    assert f"run {TRUNCATED!r} of stack 'damaged' is damaged" in err and str(paths[TRUNCATED]) in err


def test_a_damaged_stored_manifest_hides_only_its_own_adapter(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "artifacts")
    fill(store, "local")
    first, second = scan_runs(store, "local").runs
    store.put_bytes(f"runs/local/{HEALTHY[0]}/train/run_manifest.json", b'{"run": "x", "status": ')
    listed = [first.model_copy(update={"files": ["train/run_manifest.json"]}), second]
    entries, damaged = runs.adapter_entries(store, "local", listed)
    manifest = store.root / "runs" / "local" / HEALTHY[0] / "train" / "run_manifest.json"
    assert entries == [] and [(d.run_id, d.path) for d in damaged] == [(HEALTHY[0], str(manifest))]
    assert str(manifest) in damaged[0].reason
