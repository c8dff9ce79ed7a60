"""Where Pulumi keeps each stack's state, and which secrets provider encrypts its secrets.

Local stack: a file backend under `.local/pulumi-state` with the passphrase provider; the
passphrase comes from `PULUMI_CONFIG_PASSPHRASE` or a generated, git-ignored file under `.local/`.
Cloud stacks: a versioned Nebius Object Storage bucket reached through its S3-compatible endpoint,
created once by `ftstack bootstrap-backend` (the way Soperator's Terraform keeps its state).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shlex
import subprocess
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict

from infra.nebius.object_storage import StateError, nebius_s3_endpoint

LOCAL_STATE_DIR = Path(".local/pulumi-state")
PASSPHRASE_FILE = Path(".local/pulumi-passphrase")
PASSPHRASE_ENV = "PULUMI_CONFIG_PASSPHRASE"
PASSPHRASE_FILE_ENV = "PULUMI_CONFIG_PASSPHRASE_FILE"
SECRETS_PROVIDER_ENV = "FTSTACK_SECRETS_PROVIDER"
STATE_BUCKET_ENV = "FTSTACK_STATE_BUCKET"
S3_CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class BackendPlan(BaseModel):
    """How to point the Pulumi CLI at one stack's state. Holds no secret values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stack: str
    kind: Literal["file", "s3"]
    backend_url: str
    secrets_provider: str
    env: dict[str, str]
    """Non-secret variables to export (paths, region, endpoint)."""
    required_secret_env: list[str]
    """Variables the operator must export from their own secret store (names only)."""
    bucket: str | None = None
    endpoint: str | None = None
    region: str | None = None

    def login_command(self) -> str:
        return f"pulumi login {shlex.quote(self.backend_url)}"

    def stack_command(self) -> str:
        return (
            f"pulumi stack select --create {shlex.quote(self.stack)} "
            f"--secrets-provider {shlex.quote(self.secrets_provider)}"
        )

    def shell_lines(self) -> list[str]:
        lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        lines += [f"# export {name}=...   (from your secret store; never commit it)" for name in self.required_secret_env]
        lines += [self.login_command(), self.stack_command()]
        return lines


def state_bucket_name(parent_id: str, prefix: str = "pulumi-state") -> str:
    """A stable bucket name per Nebius project (FTSTACK_STATE_BUCKET overrides)."""
    override = os.environ.get(STATE_BUCKET_ENV)
    name = override or f"{prefix}-{hashlib.sha256(parent_id.encode()).hexdigest()[:16]}"
    if not _BUCKET_RE.fullmatch(name):
        raise StateError(f"state bucket name {name!r}: use 3-63 lowercase letters, digits, '.' or '-'")
    return name


def s3_backend_url(bucket: str, endpoint: str, region: str) -> str:
    """The Pulumi DIY-backend URL of a bucket on an S3-compatible endpoint."""
    query = urlencode({"endpoint": endpoint, "region": region, "s3ForcePathStyle": "true"}, safe=":/")
    return f"s3://{bucket}?{query}"


def local_backend_url(repo_root: Path) -> str:
    return f"file://{(repo_root / LOCAL_STATE_DIR).resolve()}"


def ensure_passphrase_file(repo_root: Path) -> Path:
    """Create the local passphrase file (0600, random) once; refuse if git would track it."""
    path = (repo_root / PASSPHRASE_FILE).resolve()
    if not _is_git_ignored(repo_root, path):
        raise StateError(f"{path}: not git-ignored; add '.local/' to .gitignore before storing a passphrase there")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    return path


def _is_git_ignored(repo_root: Path, path: Path) -> bool:
    """True when `path` is ignored by git, or when `repo_root` is not a git work tree."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(repo_root), "rev-parse", "--is-inside-work-tree"],
            capture_output=True, text=True, check=False,
        )
    except FileNotFoundError:
        return True
    if inside.returncode != 0:
        return True
    tracked = subprocess.run(
        ["git", "-C", str(repo_root), "ls-files", "--error-unmatch", str(path)],
        capture_output=True, check=False,
    )
    if tracked.returncode == 0:
        return False
    ignored = subprocess.run(
        ["git", "-C", str(repo_root), "check-ignore", "-q", "--no-index", str(path)],
        capture_output=True, check=False,
    )
    return ignored.returncode == 0


def local_backend_plan(stack_name: str, repo_root: Path, create_passphrase: bool = True) -> BackendPlan:
    """File backend under .local/ with the passphrase provider."""
    env: dict[str, str] = {}
    if not os.environ.get(PASSPHRASE_ENV):
        path = (repo_root / PASSPHRASE_FILE).resolve()
        if create_passphrase:
            path = ensure_passphrase_file(repo_root)
        env[PASSPHRASE_FILE_ENV] = str(path)
    return BackendPlan(
        stack=stack_name,
        kind="file",
        backend_url=local_backend_url(repo_root),
        secrets_provider="passphrase",
        env=env,
        required_secret_env=[],
    )


def cloud_backend_plan(
    stack_name: str, parent_id: str, region: str, secrets_provider: str | None = None, bucket: str | None = None
) -> BackendPlan:
    """Versioned Nebius bucket backend; secrets provider = passphrase unless a KMS URL is given."""
    bucket = bucket or state_bucket_name(parent_id)
    endpoint = nebius_s3_endpoint(region)
    provider = secrets_provider or os.environ.get(SECRETS_PROVIDER_ENV) or "passphrase"
    if provider != "passphrase" and "://" not in provider:
        raise StateError(f"secrets provider {provider!r}: use 'passphrase' or a KMS URL such as 'hashivault://key'")
    required = list(S3_CREDENTIAL_ENV)
    if provider == "passphrase":
        required.append(PASSPHRASE_ENV)
    return BackendPlan(
        stack=stack_name,
        kind="s3",
        backend_url=s3_backend_url(bucket, endpoint, region),
        secrets_provider=provider,
        env={"AWS_REGION": region},
        required_secret_env=required,
        bucket=bucket,
        endpoint=endpoint,
        region=region,
    )


class BootstrapResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: str
    created: bool
    versioning: str


def bootstrap_state_bucket(s3: Any, bucket: str, region: str) -> BootstrapResult:
    """Create the state bucket if missing, enable versioning, and verify it (idempotent)."""
    from botocore.exceptions import ClientError

    created = False
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("403", "Forbidden", "AccessDenied"):
            raise StateError(f"bucket {bucket!r} exists but these credentials cannot access it ({code})") from exc
        if code not in ("404", "NoSuchBucket", "NotFound"):
            raise StateError(f"bucket {bucket!r}: head_bucket failed: {exc}") from exc
        kwargs: dict[str, Any] = {"Bucket": bucket}
        if region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            s3.create_bucket(**kwargs)
        except ClientError as create_exc:
            raise StateError(f"bucket {bucket!r}: create failed: {create_exc}") from create_exc
        created = True
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    status = s3.get_bucket_versioning(Bucket=bucket).get("Status", "Disabled")
    if status != "Enabled":
        raise StateError(f"bucket {bucket!r}: versioning is {status!r} after enabling it; state would not be versioned")
    return BootstrapResult(bucket=bucket, created=created, versioning=status)
