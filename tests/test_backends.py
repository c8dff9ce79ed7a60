"""Pulumi state backends: local file backend + passphrase, versioned bucket bootstrap on a real S3 server."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from artifacts_fixtures import REGION, S3Server, s3_server  # noqa: F401

from infra.program.backends import (
    PASSPHRASE_FILE,
    StateError,
    bootstrap_state_bucket,
    cloud_backend_plan,
    local_backend_plan,
    state_bucket_name,
)


def git_repo(path: Path, ignore: str | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    if ignore is not None:
        (path / ".gitignore").write_text(ignore)
    return path


def test_local_plan_uses_file_backend_and_ignored_passphrase_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    repo = git_repo(tmp_path / "repo", ".local/\n")
    plan = local_backend_plan("local", repo)
    secret_file = repo / PASSPHRASE_FILE
    assert plan.backend_url == f"file://{(repo / '.local/pulumi-state').resolve()}"
    assert plan.secrets_provider == "passphrase"
    assert plan.env == {"PULUMI_CONFIG_PASSPHRASE_FILE": str(secret_file.resolve())}
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    passphrase = secret_file.read_text().strip()
    assert len(passphrase) >= 32
    assert local_backend_plan("local", repo) == plan
    assert secret_file.read_text().strip() == passphrase
    text = "\n".join(plan.shell_lines())
    assert passphrase not in text
    assert "pulumi login 'file://" in text or "pulumi login file://" in text
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert ".local" not in status


def test_passphrase_file_refused_where_git_would_track_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    repo = git_repo(tmp_path / "repo", None)
    with pytest.raises(StateError, match="not git-ignored"):
        local_backend_plan("local", repo)
    assert not (repo / PASSPHRASE_FILE).exists()


def test_passphrase_from_env_writes_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "from-env-123")
    repo = git_repo(tmp_path / "repo", ".local/\n")
    plan = local_backend_plan("local", repo)
    assert plan.env == {}
    assert not (repo / PASSPHRASE_FILE).exists()
    assert "from-env-123" not in plan.model_dump_json()


def test_cloud_plan_points_at_nebius_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FTSTACK_S3_ENDPOINT", "FTSTACK_STATE_BUCKET", "FTSTACK_SECRETS_PROVIDER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value")
    plan = cloud_backend_plan("dev", "project-e00abc", "eu-north1")
    assert plan.bucket == state_bucket_name("project-e00abc")
    assert plan.bucket != state_bucket_name("project-e00xyz")
    assert plan.endpoint == "https://storage.eu-north1.nebius.cloud"
    assert plan.backend_url == (
        f"s3://{plan.bucket}?endpoint=https://storage.eu-north1.nebius.cloud&region=eu-north1&s3ForcePathStyle=true"
    )
    assert set(plan.required_secret_env) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PULUMI_CONFIG_PASSPHRASE"}
    assert "very-secret-value" not in "\n".join(plan.shell_lines())

    kms = cloud_backend_plan("dev", "project-e00abc", "eu-north1", secrets_provider="hashivault://ftstack")
    assert kms.secrets_provider == "hashivault://ftstack"
    assert "PULUMI_CONFIG_PASSPHRASE" not in kms.required_secret_env
    with pytest.raises(StateError, match="secrets provider"):
        cloud_backend_plan("dev", "p", "eu-north1", secrets_provider="vault")
    with pytest.raises(StateError, match="nebius.region"):
        cloud_backend_plan("dev", "p", "EU North")


def test_bootstrap_creates_versioned_bucket_once(s3_server: S3Server) -> None:
    s3 = s3_server.client()
    bucket = f"pulumi-state-{os.getpid()}-a"
    first = bootstrap_state_bucket(s3, bucket, REGION)
    assert first.created and first.versioning == "Enabled"
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    for body in (b"v1", b"v2"):
        s3.put_object(Bucket=bucket, Key=".pulumi/stacks/dev.json", Body=body)
    versions = s3.list_object_versions(Bucket=bucket, Prefix=".pulumi/stacks/dev.json")["Versions"]
    assert len(versions) == 2
    second = bootstrap_state_bucket(s3, bucket, REGION)
    assert not second.created and second.versioning == "Enabled"


def test_bootstrap_enables_versioning_on_existing_unversioned_bucket(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket(versioned=False)
    s3 = s3_server.client()
    assert s3.get_bucket_versioning(Bucket=bucket).get("Status") is None
    result = bootstrap_state_bucket(s3, bucket, REGION)
    assert not result.created and s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
