"""What a stack's stored runs measured (the newest training throughput, the newest job times, the adapters' ranks),
read where its runs are stored: this machine's store for
the local and `cluster` stacks, the stack's artifacts bucket for a Nebius stack (what `pulumi up`, `ftstack plan`
and `ftstack report` price with; `ftstack run` prices a run it just measured the same way)."""

from __future__ import annotations

import os
from pathlib import Path

from documents.base import DocumentError
from documents.run_manifest import read_run_manifest
from documents.run_record import RunIndex
from documents.run_store import ADAPTER_DIR, MANIFEST_KEY, run_key, stack_key
from infra.config import StackConfig
from infra.cost.price import PriceInputs
from planning.serving import manifest_rank
from infra.runs.store import (
    ARTIFACTS_BUCKET_ENV,
    ArtifactError,
    RunStore,
    list_runs,
    read_run_file,
    store_for_stack,
)

CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def runs_of(store: RunStore, stack_name: str) -> str:
    """How the source line names where a stack's runs are stored."""
    return store.describe(stack_key(stack_name))


def artifacts_bucket(cfg: StackConfig) -> str | None:
    """The bucket a Nebius stack's runs are stored in: FTSTACK_ARTIFACTS_BUCKET, else the stack's own artifacts
    bucket (`<cluster>-artifacts`, infra/nebius/buckets.py) when it has one."""
    if os.environ.get(ARTIFACTS_BUCKET_ENV):
        return os.environ[ARTIFACTS_BUCKET_ENV]
    if cfg.buckets is not None and cfg.buckets.artifacts.enabled:
        return f"{cfg.cluster_name}-artifacts"
    return None


def stack_store(cfg: StackConfig, root: Path) -> tuple[RunStore | None, str | None]:
    """The store of the stack's runs, or None and why it cannot be read from here (a Nebius stack without a
    bucket or without object-storage credentials in the environment)."""
    if cfg.target != "nebius":
        return store_for_stack(cfg, root), None
    bucket = artifacts_bucket(cfg)
    if bucket is None:
        return None, "no artifacts bucket on this stack"
    if not all(os.environ.get(name) for name in CREDENTIAL_ENV):
        return None, f"artifacts bucket {bucket} not read: set {' and '.join(CREDENTIAL_ENV)}"
    return store_for_stack(cfg, root, bucket=bucket), None


def stored_adapter_ranks(store: RunStore, stack_name: str, runs: list[RunIndex]) -> list[int]:
    """The adapter rank of each stored run that keeps an adapter and a readable run manifest: the runs a server of
    the stack may load (planning.serving.manifest_rank, as the server reads them)."""
    ranks = []
    for run in runs:
        if MANIFEST_KEY not in run.files or not any(f.startswith(f"{ADAPTER_DIR}/") for f in run.files):
            continue
        key = f"{run_key(stack_name, run.run_id)}/{MANIFEST_KEY}"
        try:
            ranks.append(manifest_rank(read_run_manifest(read_run_file(store, stack_name, run.run_id, MANIFEST_KEY),
                                                         key)))
        except (DocumentError, ArtifactError):
            continue
    return ranks


def price_inputs(cfg: StackConfig, root: Path) -> PriceInputs:
    """What `price_stack` needs from the stack's stored runs (before a run of this command measured anything): the
    training throughput the newest stored run measured, the stage times of the newest run that recorded them, the
    adapter ranks of the stored runs, the store they were read from, or why none was read."""
    from botocore.exceptions import BotoCoreError, ClientError

    store, why = stack_store(cfg, root)
    if store is None:
        return PriceInputs(training_note=why)
    try:
        runs = list_runs(store, cfg.stack)
        timed = next((r for r in reversed(runs) if r.job_durations_s), None)
        where = runs_of(store, cfg.stack)
        return PriceInputs(training=next((r.throughput for r in reversed(runs) if r.throughput is not None), None),
                           training_read_from=where, stage_seconds=dict(timed.job_durations_s) if timed else {},
                           stage_seconds_from=f"run {timed.run_id} ({where})" if timed else None,
                           stored_ranks=stored_adapter_ranks(store, cfg.stack, runs))
    except (ArtifactError, BotoCoreError, ClientError) as error:
        return PriceInputs(training_note=f"runs not read from {runs_of(store, cfg.stack)}: {error}")
