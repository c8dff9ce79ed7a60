"""The run store: a run's config, manifest, metrics, evaluator JSON, charts and adapter, in the layout
documents.run_store owns (one folder per run, its index written last).

Two stores share that layout: `S3Store` (Nebius Object Storage through boto3) for cloud stacks and
`LocalStore` (a directory, `.local/artifacts` by default) for the local stack. Each run's index holds its key
figures, which `ftstack runs` lists.
"""

from __future__ import annotations

import mimetypes
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from documents.adapter_registry import ADAPTER_FILES, adapter_sha256
from documents.atomic import atomic_file
from documents.base import DocumentError
from documents.evaluator_report import read_evaluator_report
from documents.metrics import METRICS_NAME, read_metrics
from documents.run_config import load_run_config
from documents.run_manifest import RUN_MANIFEST_NAME, load_run_manifest
from documents.run_record import RunIndex, read_run_record
from documents.run_store import (ADAPTER_DIR, INDEX_NAME, checked_run_key, is_index_key, run_id_of_key, stack_key,
                                 write_run)
from documents.stack_outputs import StackOutputs, write_stack_outputs
from documents.throughput import ThroughputCheck, ThroughputMeasurement
from infra.nebius.object_storage import nebius_s3_endpoint

LOCAL_ARTIFACTS_DIR = Path(".local/artifacts")


class ArtifactError(RuntimeError):
    """An artifact could not be stored or read; the message names the file, key and store."""


class ArtifactUploadError(ArtifactError):
    """Some files of a run were not uploaded after every retry; local copies are untouched."""

    def __init__(self, run_prefix: str, failures: Mapping[str, str], uploaded: list[str]) -> None:
        self.failures = dict(failures)
        self.uploaded = list(uploaded)
        lines = "\n".join(f"  {name}: {error}" for name, error in failures.items())
        super().__init__(
            f"{len(failures)} artifact(s) of {run_prefix} were not uploaded (local copies kept; "
            f"re-running the upload is safe):\n{lines}"
        )


class RunStore(Protocol):
    def put_file(self, key: str, path: Path) -> None: ...
    def put_bytes(self, key: str, data: bytes) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def describe(self, key: str = "") -> str: ...


class LocalStore:
    """A directory with the bucket's layout; writes are atomic (temp file + rename)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents:
            raise ArtifactError(f"key {key!r} escapes the store {self.root}")
        return path

    def put_bytes(self, key: str, data: bytes) -> None:
        with atomic_file(self._path(key)) as tmp:
            tmp.write_bytes(data)

    def put_file(self, key: str, path: Path) -> None:
        self.put_bytes(key, Path(path).read_bytes())

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        if not path.is_file():
            raise ArtifactError(f"{self.describe(key)}: no such artifact")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ArtifactError(f"{self.describe(key)}: not readable: {exc.strerror or exc}") from None

    def list_keys(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def describe(self, key: str = "") -> str:
        return str(self.root / key) if key else str(self.root)


def make_s3_client(
    endpoint: str,
    region: str,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    max_attempts: int = 5,
    connect_timeout: float = 5.0,
    read_timeout: float = 30.0,
) -> Any:
    """A boto3 S3 client for an S3-compatible endpoint (path-style, SDK retries in standard mode).

    Credentials: the given pair (e.g. read from a Pulumi secret), else boto3's usual chain
    (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profile).
    """
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=region,
        retries={"max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        s3={"addressing_style": "path"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = boto3.session.Session(
        aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key, region_name=region
    )
    return session.client("s3", endpoint_url=endpoint, config=config)


class S3Store:
    """A bucket on an S3-compatible endpoint, with a bounded retry (exponential backoff) per object."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        attempts: int = 3,
        backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        self.client = client
        self.bucket = bucket
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._sleep = sleep
        self.retries = 0

    def _retrying(self, what: str, call: Callable[[], Any]) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        last: Exception | None = None
        for attempt in range(self.attempts):
            try:
                return call()
            except NoCredentialsError as exc:
                raise ArtifactError(f"{what}: {exc} (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)") from exc
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if status and status < 500 and status not in (408, 429):
                    raise ArtifactError(f"{what}: {exc}") from exc
                last = exc
            except BotoCoreError as exc:
                last = exc
            if attempt + 1 < self.attempts:
                self.retries += 1
                self._sleep(self.backoff_s * 2**attempt)
        raise ArtifactError(f"{what}: failed after {self.attempts} attempts: {last}") from last

    def put_bytes(self, key: str, data: bytes) -> None:
        content_type = mimetypes.guess_type(key)[0] or "application/octet-stream"
        self._retrying(
            f"upload to {self.describe(key)}",
            lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content_type),
        )

    def put_file(self, key: str, path: Path) -> None:
        self.put_bytes(key, Path(path).read_bytes())

    def get_bytes(self, key: str) -> bytes:
        response = self._retrying(
            f"download {self.describe(key)}", lambda: self.client.get_object(Bucket=self.bucket, Key=key)
        )
        return response["Body"].read()

    def list_keys(self, prefix: str) -> list[str]:
        def collect() -> list[str]:
            paginator = self.client.get_paginator("list_objects_v2")
            return [
                obj["Key"]
                for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix)
                for obj in page.get("Contents", [])
            ]

        return sorted(self._retrying(f"list {self.describe(prefix)}", collect))

    def describe(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"


@dataclass
class UploadResult:
    prefix: str
    store: str
    uploaded: list[str] = field(default_factory=list)
    index: RunIndex | None = None


def run_prefix(stack_name: str, run_id: str) -> str:
    try:
        return checked_run_key(stack_name, run_id)
    except ValueError as error:
        raise ArtifactError(str(error)) from None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ArtifactError(f"{path}: not readable: {exc}") from exc


def collect_run_files(
    run_config_path: Path,
    train_run_dir: Path | None,
    results_dir: Path | None,
    eval_job_id: str | None = None,
) -> dict[str, Path]:
    """Artifact name -> local file, for the files of one run that exist on disk."""
    files: dict[str, Path] = {"config/" + Path(run_config_path).name: Path(run_config_path)}
    if train_run_dir is not None and train_run_dir.is_dir():
        for name in (RUN_MANIFEST_NAME, METRICS_NAME):
            if (train_run_dir / name).is_file():
                files[f"train/{name}"] = train_run_dir / name
        for chart in sorted(train_run_dir.glob("*.png")) + sorted(train_run_dir.glob("*.svg")):
            files[f"train/{chart.name}"] = chart
        files.update(adapter_files(train_run_dir))
    if results_dir is not None and results_dir.is_dir():
        pattern = f"evaluator_{eval_job_id}*" if eval_job_id else "evaluator_*"
        candidates = sorted(results_dir.glob(pattern), key=lambda p: p.stat().st_mtime)
        if not eval_job_id:
            newest_json = [p for p in candidates if p.suffix == ".json"][-1:]
            stem = newest_json[0].stem if newest_json else None
            candidates = [p for p in candidates if stem and p.name.startswith(stem)]
        for path in candidates:
            if path.is_file() and path.suffix in (".json", ".png", ".svg"):
                files[f"eval/{path.name}"] = path
    return files


def adapter_files(train_run_dir: Path) -> dict[str, Path]:
    """`adapter/<file>` -> the trained adapter's config and weights, when the run manifest names a folder that
    holds both (a server loads adapters only from the store)."""
    manifest = load_run_manifest(train_run_dir / RUN_MANIFEST_NAME)
    if manifest is None or manifest.adapter is None:
        return {}
    folder = Path(manifest.adapter)
    if not all((folder / name).is_file() for name in ADAPTER_FILES):
        return {}
    return {f"{ADAPTER_DIR}/{name}": folder / name for name in ADAPTER_FILES}


def build_index(
    stack_name: str,
    run_id: str,
    files: Mapping[str, Path],
    job_ids: Mapping[str, str] | None = None,
    job_states: Mapping[str, str] | None = None,
    cost_usd: float | None = None,
    started_at: str | None = None,
    finished_at: str | None = None,
    run_name: str | None = None,
    job_durations_s: Mapping[str, float] | None = None,
) -> RunIndex:
    """Key figures read from the run's evaluator report and metrics records."""
    report_file = next((p for n, p in files.items() if n.startswith("eval/") and n.endswith(".json")), None)
    metrics_file = files.get(f"train/{METRICS_NAME}")
    try:
        evaluator = read_evaluator_report(_read_text(report_file), str(report_file)) if report_file else None
        records = read_metrics(_read_text(metrics_file), str(metrics_file)) if metrics_file else []
    except DocumentError as exc:
        raise ArtifactError(str(exc)) from None
    final_loss = next((r.loss for r in reversed(records) if r.loss is not None), None)
    adapter = files.get(f"{ADAPTER_DIR}/{ADAPTER_FILES[0]}")
    return RunIndex(
        stack=stack_name,
        run_id=run_id,
        run_name=run_name,
        started_at=started_at,
        finished_at=finished_at,
        uploaded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        job_ids=dict(job_ids or {}),
        job_states=dict(job_states or {}),
        job_durations_s=dict(job_durations_s or {}),
        perplexity_base=evaluator.base_model.perplexity if evaluator else None,
        perplexity_finetuned=evaluator.finetuned_model.perplexity if evaluator else None,
        perplexity_improvement_pct=evaluator.comparison.perplexity if evaluator else None,
        train_loss_final=final_loss,
        cost_usd=cost_usd,
        files=sorted(files),
        adapter_sha256=adapter_sha256(adapter.parent) if adapter else None,
    )


def upload_run(
    store: RunStore,
    stack_name: str,
    run_id: str,
    run_config_path: Path,
    train_run_dir: Path | None = None,
    results_dir: Path | None = None,
    job_ids: Mapping[str, str] | None = None,
    job_states: Mapping[str, str] | None = None,
    job_durations_s: Mapping[str, float] | None = None,
    cost_usd: float | None = None,
    started_at: str | None = None,
    finished_at: str | None = None,
    outputs: StackOutputs | None = None,
    throughput: ThroughputMeasurement | None = None,
    throughput_check: ThroughputCheck | None = None,
) -> UploadResult:
    """Copy one run's artifacts into its folder of the store, each file with the store's own retries and every
    failure collected instead of stopping, then write its index last (documents.run_store.write_run).

    The run's name comes from the run config; `train_run_dir`/`results_dir` (folders fetched from a cluster)
    default to the run config's own locations on this machine. Raises
    ArtifactUploadError naming every file that failed after retries; local files are never removed.
    """
    prefix = run_prefix(stack_name, run_id)
    config = load_run_config(run_config_path)
    run_name = config.name
    train_run_dir = train_run_dir or config.train_run_dir
    results_dir = results_dir or config.results_dir
    eval_job = (job_ids or {}).get("eval")
    files = collect_run_files(Path(run_config_path), train_run_dir, results_dir, eval_job)
    index = build_index(
        stack_name, run_id, files, job_ids, job_states, cost_usd, started_at, finished_at, run_name, job_durations_s
    )
    contents: dict[str, Path | bytes] = dict(sorted(files.items()))
    if outputs is not None:
        contents["outputs.json"] = write_stack_outputs(outputs).encode()
    try:
        done = write_run(store.put_file, store.put_bytes, stack_name, run_id, contents,
                         lambda written: index.model_copy(update={"files": sorted(written), "throughput": throughput,
                                                                  "throughput_check": throughput_check}),
                         caught=(ArtifactError, OSError))
    except ArtifactError as exc:
        raise ArtifactUploadError(store.describe(prefix), {INDEX_NAME: str(exc)}, list(contents)) from exc
    if done.failed:
        raise ArtifactUploadError(store.describe(prefix), done.failed, done.written)
    return UploadResult(prefix=prefix, store=store.describe(prefix), uploaded=sorted(done.written), index=done.index)


@dataclass(frozen=True)
class DamagedRun:
    """A stored run whose `run.json` cannot be read or does not describe it: listed beside the runs, never used."""

    run_id: str
    path: str
    reason: str


@dataclass(frozen=True)
class RunListing:
    runs: list[RunIndex]
    """the readable runs, oldest first"""
    damaged: list[DamagedRun]
    """runs whose index is unreadable, invalid or names another run, in key order"""


def _read_index(store: RunStore, stack_name: str, key: str) -> RunIndex | DamagedRun:
    run_id = run_id_of_key(key)
    try:
        index = read_run_record(store.get_bytes(key), store.describe(key))
    except (ArtifactError, DocumentError) as exc:
        return DamagedRun(run_id, store.describe(key), str(exc))
    if (index.stack, index.run_id) != (stack_name, run_id):
        return DamagedRun(run_id, store.describe(key), f"{store.describe(key)}: names run {index.run_id!r} of stack "
                          f"{index.stack!r}, stored as run {run_id!r} of stack {stack_name!r}")
    return index


def scan_runs(store: RunStore, stack_name: str) -> RunListing:
    """Every run of `stack_name` that has a `run.json`; one that cannot be read is listed as damaged, the others stay
    usable."""
    read = [_read_index(store, stack_name, key) for key in store.list_keys(stack_key(stack_name)) if is_index_key(key)]
    runs = [r for r in read if isinstance(r, RunIndex)]
    return RunListing(runs=sorted(runs, key=lambda r: (r.started_at or r.uploaded_at, r.run_id)),
                      damaged=[r for r in read if isinstance(r, DamagedRun)])


def list_runs(store: RunStore, stack_name: str) -> list[RunIndex]:
    """Every readable run of `stack_name`, oldest first (`scan_runs` also names the damaged ones)."""
    return scan_runs(store, stack_name).runs


def read_run_file(store: RunStore, stack_name: str, run_id: str, name: str) -> bytes:
    return store.get_bytes(f"{run_prefix(stack_name, run_id)}/{name}")


def local_store(repo_root: Path) -> LocalStore:
    return LocalStore(Path(repo_root) / LOCAL_ARTIFACTS_DIR)


ARTIFACTS_BUCKET_ENV = "FTSTACK_ARTIFACTS_BUCKET"


def store_for_stack(
    stack_config: Any,
    repo_root: Path,
    bucket: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
) -> RunStore:
    """The local directory store for a local or existing-cluster stack; the stack's artifacts bucket otherwise.

    The bucket name comes from `bucket` (e.g. the stack output), else FTSTACK_ARTIFACTS_BUCKET.
    Credentials: the given pair (e.g. a Pulumi secret), else AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY.
    """
    if stack_config.target in ("local", "cluster"):
        return local_store(repo_root)
    bucket = bucket or os.environ.get(ARTIFACTS_BUCKET_ENV)
    if not bucket:
        raise ArtifactError(
            f"stack {stack_config.stack!r}: no artifacts bucket known; pass the stack output "
            f"(ftstack ... --outputs FILE) or set {ARTIFACTS_BUCKET_ENV}"
        )
    region = stack_config.nebius.region
    client = make_s3_client(nebius_s3_endpoint(region), region, access_key_id, secret_access_key)
    return S3Store(client, bucket)
