"""The newest training throughput measured on a stack, read where its runs are stored: this machine's store for
the local and `cluster` stacks, the stack's artifacts bucket for a Nebius stack (what `pulumi up`, `ftstack plan`
and `ftstack report` price with; `ftstack run` prices a run it just measured the same way)."""

from __future__ import annotations

import os
from pathlib import Path

from documents.run_store import stack_key
from infra.config import StackConfig
from infra.cost.price import PriceInputs
from infra.runs.store import (
    ARTIFACTS_BUCKET_ENV,
    ArtifactError,
    RunStore,
    latest_throughput,
    list_runs,
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


def price_inputs(cfg: StackConfig, root: Path) -> PriceInputs:
    """What `price_stack` needs from the stack's stored runs (before a run of this command measured anything): the
    training throughput the newest stored run measured, the stage times of the newest run that recorded them, the
    store they were read from, or why none was read."""
    from botocore.exceptions import BotoCoreError, ClientError

    store, why = stack_store(cfg, root)
    if store is None:
        return PriceInputs(training_note=why)
    try:
        timed = next((r for r in reversed(list_runs(store, cfg.stack)) if r.job_durations_s), None)
        return PriceInputs(training=latest_throughput(store, cfg.stack), training_read_from=runs_of(store, cfg.stack),
                           stage_seconds=dict(timed.job_durations_s) if timed else {},
                           stage_seconds_from=f"run {timed.run_id} ({runs_of(store, cfg.stack)})" if timed else None)
    except (ArtifactError, BotoCoreError, ClientError) as error:
        return PriceInputs(training_note=f"runs not read from {runs_of(store, cfg.stack)}: {error}")
