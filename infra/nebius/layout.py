"""Pure layout of a Soperator cluster on mk8s: which node groups exist, how they are labelled and
tainted, and which shared filesystems each one attaches under which mount tag.

The components in this package only turn these specs into resources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from planning import catalog
from infra.config import AutoscaledNodeSet, BootDisk, Filesystem, NodeSet, StackConfig, WorkerSet

GIB = 1024**3
LABEL_NODESET = "slurm.nebius.ai/nodeset"
LABEL_WORKLOAD = "slurm.nebius.ai/workload"
LABEL_JAIL = "slurm.nebius.ai/jail"
LABEL_NEBIUS_GPU = "nebius.com/gpu"
TAINT_GPU = "nvidia.com/gpu"

JAIL = "jail"
CONTROLLER_SPOOL = "controller-spool"
ACCOUNTING = "accounting"
SUBMOUNT_PREFIX = "jail-submount"

Role = Literal["system", "controller", "login", "accounting", "worker"]


def submount_tag(name: str) -> str:
    return f"{SUBMOUNT_PREFIX}-{name}"


@dataclass(frozen=True)
class FilesystemSpec:
    """One shared filesystem; ``mount_tag`` is both its virtiofs tag and its chart device name."""

    mount_tag: str
    name: str
    size_gib: int | None
    existing_id: str | None
    type: str
    protect: bool
    mount_path: str | None = None

    @property
    def created(self) -> bool:
        return self.existing_id is None


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str = "NO_SCHEDULE"


@dataclass(frozen=True)
class NodeGroupSpec:
    """One mk8s node group: a Slurm role (and for workers, one worker set)."""

    name: str
    role: Role
    platform: str
    preset: str
    boot_disk: BootDisk
    fixed_size: int | None
    min_size: int | None
    max_size: int | None
    mount_tags: tuple[str, ...]
    labels: dict[str, str] = field(hash=False)
    taints: tuple[Taint, ...] = ()
    fabric: str | None = None
    preemptible: bool = False
    ephemeral: bool = False
    """Soperator ephemeral nodes: Slurm powers this worker set's nodes down when idle and up for a job."""
    drivers_preset: str | None = None
    """Nebius GPU drivers preset of the node image; None: no drivers in the image."""
    gpu_operator: bool = False
    """The NVIDIA GPU operator brings the drivers (worker sets with ``gpuDrivers: gpu-operator``)."""

    @property
    def shape(self) -> catalog.Preset:
        return catalog.get_preset(self.platform, self.preset)

    @property
    def gpus(self) -> int:
        return self.shape.gpus

    @property
    def size(self) -> int:
        """Nodes at most: the fixed count, else the autoscaling maximum."""
        size = self.fixed_size if self.fixed_size is not None else self.max_size
        assert size is not None
        return size


def _fs(tag: str, name: str, fs: Filesystem, mount_path: str | None = None) -> FilesystemSpec:
    return FilesystemSpec(tag, name, fs.size_gib, fs.existing_id, fs.type, fs.protect, mount_path)


def filesystem_specs(cfg: StackConfig) -> list[FilesystemSpec]:
    """Jail, submounts, controller spool, accounting, named ``<cluster>-<tag>``."""
    fs = cfg.filesystems
    if fs is None:
        return []
    prefix = cfg.cluster_name
    specs = [_fs(JAIL, f"{prefix}-{JAIL}", fs.jail)]
    specs += [
        _fs(submount_tag(s.name), f"{prefix}-{submount_tag(s.name)}", s, s.mount_path) for s in fs.submounts
    ]
    specs.append(_fs(CONTROLLER_SPOOL, f"{prefix}-{CONTROLLER_SPOOL}", fs.controller_spool))
    if fs.accounting is not None:
        specs.append(_fs(ACCOUNTING, f"{prefix}-{ACCOUNTING}", fs.accounting))
    return specs


def _mounts(cfg: StackConfig, role: Role) -> tuple[str, ...]:
    fs = cfg.filesystems
    assert fs is not None
    tags = [JAIL, *(submount_tag(s.name) for s in fs.submounts)]
    if role == "controller":
        tags.insert(0, CONTROLLER_SPOOL)
    if role in ("controller", "accounting") and fs.accounting is not None:
        tags.append(ACCOUNTING)
    return tuple(tags)


def _labels(nodeset: str, gpu: bool) -> dict[str, str]:
    labels = {LABEL_NODESET: nodeset, LABEL_WORKLOAD: "gpu" if gpu else "cpu", LABEL_JAIL: "true"}
    if gpu:
        labels[LABEL_NEBIUS_GPU] = "true"
    return labels


def _fixed(cfg: StackConfig, role: Role, ns: NodeSet) -> NodeGroupSpec:
    gpu = catalog.get_preset(ns.platform, ns.preset).gpus > 0
    return NodeGroupSpec(
        name=role, role=role, platform=ns.platform, preset=ns.preset, boot_disk=ns.boot_disk,
        fixed_size=ns.size, min_size=None, max_size=None, mount_tags=_mounts(cfg, role),
        labels=_labels(role, gpu), taints=(Taint(LABEL_NODESET, role),),
    )


def _system(cfg: StackConfig, ns: AutoscaledNodeSet) -> NodeGroupSpec:
    return NodeGroupSpec(
        name="system", role="system", platform=ns.platform, preset=ns.preset, boot_disk=ns.boot_disk,
        fixed_size=None, min_size=ns.min_size, max_size=ns.max_size,
        mount_tags=_mounts(cfg, "system"), labels=_labels("system", False),
    )


def _worker(cfg: StackConfig, w: WorkerSet) -> NodeGroupSpec:
    gpus = w.shape.gpus
    return NodeGroupSpec(
        name=w.name, role="worker", platform=w.platform, preset=w.preset, boot_disk=w.boot_disk,
        fixed_size=None if w.min_size is not None else w.size, min_size=w.min_size,
        max_size=w.size if w.min_size is not None else None, mount_tags=_mounts(cfg, "worker"),
        labels=_labels(w.name, gpus > 0), taints=(Taint(TAINT_GPU, str(gpus)),) if gpus else (),
        fabric=w.fabric, preemptible=w.preemptible, ephemeral=w.ephemeral, drivers_preset=w.node_drivers_preset,
        gpu_operator=gpus > 0 and w.gpu_drivers == "gpu-operator",
    )


def node_group_specs(cfg: StackConfig) -> list[NodeGroupSpec]:
    """System, controller, login, optional accounting, then one group per worker set."""
    nodes = cfg.nodes
    if nodes is None:
        return []
    specs = [_system(cfg, nodes.system), _fixed(cfg, "controller", nodes.controller), _fixed(cfg, "login", nodes.login)]
    if nodes.accounting is not None:
        specs.append(_fixed(cfg, "accounting", nodes.accounting))
    specs += [_worker(cfg, w) for w in nodes.workers]
    return specs


@dataclass(frozen=True)
class Layout:
    """The node groups and filesystems of a stack, computed once per program run and passed down to the
    components, the Helm values, the cost lines and the outputs."""

    node_groups: tuple[NodeGroupSpec, ...]
    filesystems: tuple[FilesystemSpec, ...]


def layout(cfg: StackConfig) -> Layout:
    return Layout(tuple(node_group_specs(cfg)), tuple(filesystem_specs(cfg)))
