"""Buckets: jail backups (a restic repository k8up writes; restic's own prune keeps ``retentionDays``) and versioned run
artifacts."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_nebius as nebius

from infra.config import Buckets as BucketsConfig


@dataclass
class BucketsArgs:
    parent_id: pulumi.Input[str]
    """Nebius project id."""
    name: str
    """Prefix of the bucket names."""
    config: BucketsConfig
    """Which buckets to create and how."""


class Buckets(pulumi.ComponentResource):
    """``StorageV1Bucket`` for backups and artifacts; each protected unless its config says not."""

    names: dict[str, pulumi.Output[str]]
    ids: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: BucketsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("soperator-finetune:nebius:Buckets", name, None, opts)
        self.names, self.ids = {}, {}
        backups, artifacts = args.config.backups, args.config.artifacts
        if backups.enabled:
            # No lifecycle rule: an expiration would delete restic's config, keys/ and the first packs every later
            # snapshot references; the backup schedule's prune (keepDaily) removes old snapshots.
            self._bucket(name, args, "backups", backups.protect, versioning_policy="DISABLED")
        if artifacts.enabled:
            self._bucket(
                name, args, "artifacts", artifacts.protect,
                versioning_policy="ENABLED" if artifacts.versioning else "DISABLED",
            )
        self.register_outputs({"names": self.names, "ids": self.ids})

    def _bucket(self, name: str, args: BucketsArgs, kind: str, protect: bool, **spec: object) -> None:
        bucket = nebius.StorageV1Bucket(
            f"{name}-{kind}",
            parent_id=args.parent_id,
            name=f"{args.name}-{kind}",
            opts=pulumi.ResourceOptions(parent=self, protect=protect),
            **spec,
        )
        self.names[kind] = bucket.name
        self.ids[kind] = bucket.id
