"""SharedFilesystems: the jail, its submounts, the controller spool and the accounting store."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_nebius as nebius

from infra.nebius.layout import GIB, FilesystemSpec


@dataclass
class SharedFilesystemsArgs:
    parent_id: pulumi.Input[str]
    """Nebius project id."""
    specs: list[FilesystemSpec]
    """Filesystems to create (or reuse, where a spec has ``existing_id``)."""


class SharedFilesystems(pulumi.ComponentResource):
    """Creates each filesystem (protected and deletion-guarded when its spec says so) or looks up an
    existing one; exposes ids and sizes keyed by mount tag."""

    ids: dict[str, pulumi.Output[str]]
    size_gib: dict[str, pulumi.Output[int]]

    def __init__(self, name: str, args: SharedFilesystemsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("soperator-finetune:nebius:SharedFilesystems", name, None, opts)
        self.ids, self.size_gib = {}, {}
        for spec in args.specs:
            if spec.created:
                self._create(name, args.parent_id, spec)
            else:
                self._reuse(spec)
        self.register_outputs({"ids": self.ids, "size_gib": self.size_gib})

    def _create(self, name: str, parent_id: pulumi.Input[str], spec: FilesystemSpec) -> None:
        fs = nebius.ComputeV1Filesystem(
            f"{name}-{spec.mount_tag}",
            parent_id=parent_id,
            name=spec.name,
            type=spec.type,
            size_gibibytes=spec.size_gib,
            block_size_bytes=4096,
            forbid_deletion=spec.protect,
            labels={"soperator-finetune/mount-tag": spec.mount_tag},
            opts=pulumi.ResourceOptions(parent=self, protect=spec.protect),
        )
        self.ids[spec.mount_tag] = fs.id
        self.size_gib[spec.mount_tag] = pulumi.Output.from_input(spec.size_gib)

    def _reuse(self, spec: FilesystemSpec) -> None:
        found = nebius.get_compute_v1_filesystem_output(
            id=spec.existing_id, opts=pulumi.InvokeOutputOptions(parent=self)
        )
        self.ids[spec.mount_tag] = found.id
        self.size_gib[spec.mount_tag] = (
            pulumi.Output.from_input(spec.size_gib)
            if spec.size_gib
            else found.status.apply(lambda s: int(s.size_bytes // GIB))
        )
