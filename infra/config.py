"""StackConfig: the one typed description of a stack, read from its Pulumi config.

Keys live in the ``soperator-finetune:`` namespace of ``stacks/Pulumi.<stack>.yaml`` and are
camelCase there (``clusterName``, ``nodes.workers[0].bootDisk.sizeGib``); the Python attributes
are snake_case. Secrets (``secure:`` values) are never part of StackConfig: the program reads
them as Pulumi secrets (see ``SECRET_KEYS``).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from documents.names import StackName, checked_name
from documents.run_config import RunConfig, load_run_config
from documents.text_input import TextInputError, load_json, read_utf8
from planning import catalog
from planning.prices import PricingConfig
from planning.stack import ExistingNodes, PlanStack, PlanWorkerSet

PROJECT = "soperator-finetune"
REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout this package runs from (stacks/, workloads/configs/ and .local/ are found under it)."""
# Config namespaces a stack file may use: this project's and those of the providers the program creates.
KNOWN_NAMESPACES = (PROJECT, "pulumi", "nebius", "kubernetes", "command")
SECRET_KEYS = ("pipelineSshPrivateKey",)
DiskType = Literal["NETWORK_SSD", "NETWORK_SSD_NON_REPLICATED", "NETWORK_SSD_IO_M3", "NETWORK_HDD"]
FilesystemType = Literal["NETWORK_SSD", "NETWORK_HDD"]
GpuDrivers = Literal["nebius-preset", "gpu-operator"]
_RESERVED_NODESETS = {"system", "controller", "login", "accounting"}
_RESERVED_MOUNTS = {"/", "/proc", "/sys", "/dev", "/run", "/tmp", "/mnt/jail"}


class StackConfigError(ValueError):
    """A stack file that does not validate; the message names the file and every bad key."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class NebiusConfig(_Model):
    parent_id: str = Field(min_length=1, description="Nebius project id that owns every resource.")
    region: str = Field("eu-north1", description="Nebius region of the project.")
    subnet_id: str | None = Field(None, description="Existing VPC subnet; None creates one.")
    network_id: str | None = Field(None, description="VPC network for a new subnet.")
    k8s_version: str = Field(
        "1.36", alias="k8sVersion",
        description="Managed Kubernetes version; one with preinstalled GPU images (catalog.SUPPORTED_DRIVER_PRESETS_BY_K8S).",
    )
    public_endpoint: bool = Field(True, description="Give the k8s API a public address.")
    tenant_id: str | None = Field(
        None, description="Nebius tenant id; its 'editors' group lets the backup service account write the bucket."
    )

    @model_validator(mode="after")
    def _subnet_or_network(self) -> NebiusConfig:
        if self.subnet_id is None and self.network_id is None:
            raise ValueError("set subnetId (existing subnet) or networkId (create a subnet in it)")
        return self


class BootDisk(_Model):
    type: DiskType = "NETWORK_SSD"
    size_gib: int = Field(gt=0)


class _Machine(_Model):
    platform: str
    preset: str
    boot_disk: BootDisk

    @field_validator("platform")
    @classmethod
    def _known_platform(cls, value: str) -> str:
        catalog.get_platform(value)
        return value

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str, info: ValidationInfo) -> str:
        platform = info.data.get("platform")
        if platform is not None:
            catalog.get_preset(platform, value)
        return value

    @property
    def shape(self) -> catalog.Preset:
        return catalog.get_preset(self.platform, self.preset)


class NodeSet(_Machine):
    size: int = Field(gt=0)


class AutoscaledNodeSet(_Machine):
    min_size: int = Field(gt=0)
    max_size: int = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> AutoscaledNodeSet:
        if self.max_size < self.min_size:
            raise ValueError(f"maxSize {self.max_size} is below minSize {self.min_size}")
        return self


class WorkerSet(NodeSet):
    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")
    fabric: str | None = Field(None, description="InfiniBand fabric, e.g. fabric-6; None for none.")
    preemptible: bool = Field(
        False, description="Preemptible VMs (the node group template's preemptible, as the reference's `preemptible = {}`)."
    )
    ephemeral: bool = Field(
        False, description="Soperator ephemeral nodes (NodeSet ephemeralNodes): Slurm powers idle workers down after "
        "soperator.suspendTimeSeconds and up for a job (ResumeProgram/SuspendProgram drive the NodeSetPowerState).",
    )
    initial_active: int | None = Field(
        None, ge=0, description="Ephemeral workers powered up at creation (initialNumberEphemeralNodes; chart default 1).",
    )
    topology_wait_seconds: int | None = Field(
        None, ge=60, description="How long a powered-up worker waits for its topology labels (ephemeralTopologyWaitTimeout; "
        "CRD minimum 60, default 180).",
    )
    min_size: int | None = Field(
        None, ge=0, description="Autoscale the node group between minSize and size (0: no VM while every worker is "
        "powered down); unset: a fixed node count of size.",
    )
    gpu_drivers: GpuDrivers = Field(
        "nebius-preset",
        description="nebius-preset: drivers in the node image (gpu_settings.drivers_preset); "
        "gpu-operator: plain image plus the NVIDIA GPU operator (Nebius application).",
    )
    drivers_preset: str | None = Field(
        None, description="Nebius drivers preset; default: the platform's (planning/catalog.py)."
    )
    cuda_version: str | None = Field(
        None, pattern=r"^\d+\.\d+\.\d+$",
        description="CUDA version (X.Y.Z) of Soperator's images on these workers; default: the platform's.",
    )

    @model_validator(mode="after")
    def _elastic(self) -> WorkerSet:
        if self.min_size is not None and self.min_size > self.size:
            raise ValueError(f"minSize {self.min_size} is above size {self.size}")
        if self.min_size is not None and self.min_size < self.size and not self.ephemeral:
            raise ValueError(f"minSize {self.min_size} below size {self.size} frees nodes only with ephemeral: true "
                             "(a non-ephemeral NodeSet keeps a slurmd pod on every node)")
        for key, value in (("initialActive", self.initial_active), ("topologyWaitSeconds", self.topology_wait_seconds)):
            if value is not None and not self.ephemeral:
                raise ValueError(f"{key}: only with ephemeral: true")
        if self.initial_active is not None and self.initial_active > self.size:
            raise ValueError(f"initialActive {self.initial_active} is above size {self.size}")
        return self

    @property
    def elastic(self) -> bool:
        """Whether this worker set's node group can give nodes back (ephemeral, autoscaled below its size)."""
        return self.ephemeral and self.min_size is not None and self.min_size < self.size

    @model_validator(mode="after")
    def _drivers(self) -> WorkerSet:
        gpu = self.shape.gpus > 0
        if not gpu and self.drivers_preset is not None:
            raise ValueError(f"driversPreset: {self.platform} has no GPU")
        if self.gpu_drivers == "gpu-operator" and self.drivers_preset is not None:
            raise ValueError("driversPreset: only with gpuDrivers nebius-preset (the GPU operator brings its own)")
        if not gpu and self.cuda_version is not None:
            raise ValueError(f"cudaVersion: {self.platform} has no GPU")
        return self

    @property
    def node_cuda_version(self) -> str | None:
        """The CUDA version of this worker set's images, None on CPU workers."""
        if self.shape.gpus == 0:
            return None
        return self.cuda_version or catalog.get_platform(self.platform).cuda_version

    @property
    def node_drivers_preset(self) -> str | None:
        """The drivers preset of this worker set's node group, None where the image has no drivers."""
        if self.shape.gpus == 0 or self.gpu_drivers != "nebius-preset":
            return None
        return self.drivers_preset or catalog.get_platform(self.platform).drivers_preset

    @field_validator("name")
    @classmethod
    def _not_a_role(cls, value: str) -> str:
        if value in _RESERVED_NODESETS:
            raise ValueError(f"worker set name {value!r} is reserved for a Slurm role")
        return value

    @field_validator("fabric")
    @classmethod
    def _fabric_fits(cls, value: str | None, info: ValidationInfo) -> str | None:
        platform, preset = info.data.get("platform"), info.data.get("preset")
        if value is not None and platform and preset:
            if not catalog.get_preset(platform, preset).gpu_cluster_compatible:
                raise ValueError(f"{platform}/{preset} cannot join an InfiniBand GPU cluster")
        return value


class ControllerNodeSet(NodeSet):
    size: int = Field(1, ge=1, le=1, description="One node: Soperator runs a single slurmctld.")


class NodeSets(_Model):
    system: AutoscaledNodeSet
    controller: ControllerNodeSet
    login: NodeSet
    accounting: NodeSet | None = None
    workers: list[WorkerSet]

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: list[WorkerSet]) -> list[WorkerSet]:
        if not value:
            raise ValueError("at least one worker set is required")
        names = [w.name for w in value]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"duplicate worker set names: {', '.join(dupes)}")
        if any(not w.shape.gpus for w in value) and any(w.shape.gpus for w in value):
            raise ValueError("mixing CPU-only and GPU worker sets is not supported")
        return value


class Filesystem(_Model):
    size_gib: int | None = Field(None, gt=0)
    existing_id: str | None = Field(None, description="Use this filesystem instead of creating one.")
    type: FilesystemType = "NETWORK_SSD"
    protect: bool = Field(True, description="Deletion guard: Pulumi protect and forbid_deletion.")

    @model_validator(mode="after")
    def _size_or_existing(self) -> Filesystem:
        if self.size_gib is None and self.existing_id is None:
            raise ValueError("set sizeGib (create) or existingId (reuse)")
        return self


class Submount(Filesystem):
    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")
    mount_path: str

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not path.is_absolute():
            raise ValueError(f"mount path {value!r} must be absolute")
        if str(path) in _RESERVED_MOUNTS:
            raise ValueError(f"mount path {value!r} is reserved")
        return str(path)


class Filesystems(_Model):
    jail: Filesystem
    submounts: list[Submount] = []
    controller_spool: Filesystem
    accounting: Filesystem | None = None

    @field_validator("submounts")
    @classmethod
    def _unique(cls, value: list[Submount]) -> list[Submount]:
        for attr, label in (("name", "names"), ("mount_path", "mount paths")):
            seen = [getattr(s, attr) for s in value]
            if dupes := sorted({v for v in seen if seen.count(v) > 1}):
                raise ValueError(f"duplicate submount {label}: {', '.join(dupes)}")
        return value


class BackupBucket(_Model):
    enabled: bool = True
    protect: bool = True
    retention_days: int = Field(7, gt=0, description="Daily backups kept (k8up prune keepDaily; the bucket itself never expires objects).")
    schedule: str = Field("@daily-random", min_length=1, description="k8up backup schedule (cron or @daily-random).")
    prune_schedule: str = Field("@daily-random", min_length=1, description="k8up prune schedule.")
    copy_size_gib: int | None = Field(None, gt=0, description="Size of one backup; default jail size.")


class ArtifactsBucket(_Model):
    enabled: bool = True
    protect: bool = True
    versioning: bool = True


class Buckets(_Model):
    backups: BackupBucket = BackupBucket()
    artifacts: ArtifactsBucket = ArtifactsBucket()


ActiveChecksScope = Literal["dev", "testing", "prod_quick", "prod_acceptance", "essential", "off"]


class ActiveChecksConfig(_Model):
    """Soperator's active checks (helm-soperatorchecks and helm-soperator-activechecks), as the reference install
    sets them; see infra/soperator/active_checks.py."""

    scope: ActiveChecksScope = Field(
        "prod_quick", description="The reference's active_checks_scope (what runs after creation); off: no checks."
    )
    node_replacement: bool = Field(
        True, description="Let soperatorchecks replace nodes whose checks failed (checks.manager.enableNodeReplacement); "
        "on as the reference install sets it (the chart's default is off).",
    )


class SoperatorConfig(_Model):
    version: str = Field("4.1.7", description="Soperator chart version (a released tag).")
    slurm_version: str = Field("25.11.3", description="Slurm version in that release's images.")
    cert_manager_version: str = "v1.19.1"
    kruise_version: str = "1.8.0"
    mariadb_operator_version: str = "25.10.2"
    k8up_version: str = "4.8.3"
    registry: str = "cr.eu-north1.nebius.cloud/soperator"
    chart_mirror: str | None = Field(
        None, description="Folder of chart packages (`<name>-<version>.tgz`) every release installs from instead of "
        "its repository (an air-gapped install); unset: the environment variable FT_CHART_MIRROR, else the repositories.",
    )
    slurm_cluster_name: str = Field(
        "soperator", pattern=r"^[a-z][a-z0-9-]{0,40}$",
        description="Name of the SlurmCluster; Soperator 4.1.7's active checks reach only `soperator` "
        "(infra/soperator/active_checks.py HARD_CODED), as the reference install names it.",
    )
    namespace: str = Field(
        "soperator", pattern=r"^[a-z][a-z0-9-]{0,62}$",
        description="Namespace of the Slurm cluster; the active checks hard-code `soperator` as well.",
    )
    active_checks: ActiveChecksConfig = Field(ActiveChecksConfig(), description="Soperator's active checks.")
    suspend_time_seconds: int = Field(
        600, gt=0, description="Idle seconds before Slurm powers an ephemeral worker down (SlurmCluster "
        "slurmConfig.suspendTime; the CRD default 1000000000 never does). Sent only with an ephemeral worker set.",
    )


class MonitoringConfig(_Model):
    """GPU and job monitoring of a nebius stack, installed as Soperator's reference install (soperator-fluxcd 4.1.7)
    does: the DCGM exporter with per-job labels, the Slurm exporter, VictoriaMetrics and Grafana."""

    enabled: bool = Field(True, description="Install the monitoring releases (nebius stacks; off: none, and no cost lines).")
    retention_days: int = Field(30, gt=0, description="Days VictoriaMetrics keeps samples (vmsingle retentionPeriod).")
    storage_gib: int = Field(30, gt=0, description="Size of VictoriaMetrics' NETWORK_SSD volume claim.")
    vm_stack_version: str = Field("0.39.4", description="victoria-metrics-k8s-stack chart (the reference pins 0.39.*).")
    vm_crds_version: str = Field("0.0.3", description="victoria-metrics-operator-crds chart.")
    prometheus_crds_version: str = Field("19.1.0", description="prometheus-operator-crds chart (the reference pins 19.1.*).")


ENV_ROOT_UNSAFE = re.compile(r"[^A-Za-z0-9._+@,=/-]")
"""characters an environment root may not hold: whitespace, `#`, quotes, `$` and the rest a shell or a script splits"""


class EnvironmentConfig(_Model):
    """The workloads' Python environment on the cluster, built by the pipeline's `environment` stage from the lock
    (locks/, docs/environment.md) into the shared jail, once per lock, Python and platform."""

    source: Literal["index", "wheelhouse", "container"] = Field(
        "index", description="index: the nodes install from the package index; wheelhouse: this machine downloads "
        "the locked wheels and ships them (no network on the cluster); container: jobs run in `image` (Pyxis).")
    lock: Literal["local", "jail"] = Field(
        "jail", description="Target of the lock to install: jail (Python 3.12, torch's CUDA build) or local "
        "(this machine's Python 3.11 and torch's CPU build: the rehearsal cluster).")
    image: str | None = Field(None, description="Container image the jobs run in (source: container).")
    root: str = Field("/home/shared/finetune_env", description="Folder of the environments in the jail.")

    @field_validator("root")
    @classmethod
    def _contained_root(cls, value: str) -> str:
        """An absolute path that stays where it is written (no `..`: it would leave the jail on a cluster's jail
        root), normalised (`//`, `/./`, a trailing `/`)."""
        path = PurePosixPath(value)
        if not path.is_absolute():
            raise ValueError(f"environment.root {value!r} must be an absolute path in the jail")
        if bad := sorted(set(ENV_ROOT_UNSAFE.findall(value))):
            raise ValueError(f"environment.root {value!r} holds {', '.join(repr(c) for c in bad)}: it is written into "
                             "shell commands and job scripts, so only letters, digits and . _ + @ , = - / are taken")
        if ".." in path.parts:
            raise ValueError(f"environment.root {value!r} must not contain '..' (it would leave the folder it names)")
        return str(PurePosixPath("/", *path.parts[1:]))

    @model_validator(mode="after")
    def _image_with_container(self) -> EnvironmentConfig:
        if (self.source == "container") != (self.image is not None):
            raise ValueError("environment.image: give it exactly when environment.source is container")
        registry = (self.image or "").split("@")[-1].split("/")[0]
        if self.image and "#" not in self.image and not self.image.startswith(("/", "./")) and "/" in self.image \
                and ("." in registry or ":" in registry or registry == "localhost"):
            raise ValueError(f"environment.image {self.image!r}: Pyxis (enroot) names a registry with '#', "
                             f"[USER@][REGISTRY#]IMAGE[:TAG], e.g. {self.image.replace('/', '#', 1)}")
        return self


class PipelineConfig(_Model):
    run_config: str = Field(description="Run config JSON, e.g. workloads/configs/local.json.")
    wait: bool = True
    serve: bool = False
    python: str = Field("python3", description="The cluster's own interpreter, which builds the environment "
                        "(the jobs then run the environment's); on the local stack unused (the repository's venv).")
    environment: EnvironmentConfig | None = Field(
        None, description="The workloads' environment on the cluster (default: from the index); none on local.")
    ssh_user: str = Field("root", description="Login-node user the pipeline connects as (cloud stacks).")
    ssh_port: int = Field(22, gt=0, lt=65536, description="Login-node SSH port (cloud stacks).")
    login_host_key: str | None = Field(
        None, description="Pinned OpenSSH public host key of the login node; recorded on first use when unset."
    )
    require_pinned_host_key: bool = Field(
        False, description="Connect only to the pinned loginHostKey: no trust on first use, no known_hosts."
    )
    max_run_usd: float = Field(
        10_000.0, gt=0, description="Ceiling on one training run's estimated cost (USD): `ftstack plan` refuses a "
        "run config over it, naming both figures (a typo such as max_steps 10**30 costs a fortune otherwise).")
    max_run_hours: float = Field(
        168.0, gt=0, description="Ceiling on one training run's estimated wall time (hours; default a week): "
        "`ftstack plan` refuses a run config over it, naming both figures.")

    @model_validator(mode="after")
    def _pin_given_when_required(self) -> PipelineConfig:
        if self.require_pinned_host_key and not self.login_host_key:
            raise ValueError("requirePinnedHostKey is set but loginHostKey is empty: pin the login node's "
                             "public host key (ssh-keyscan -t ecdsa,ed25519 <login address>)")
        return self


class ExistingCluster(_Model):
    """A Slurm cluster that already runs elsewhere (plain Slurm or Soperator), reached over SSH to its login node.

    The pipeline's private key is the Pulumi secret ``pipelineSshPrivateKey`` (``ftstack``: ``--ssh-key FILE``)."""

    login_host: str = Field(min_length=1, description="Address of the login node.")
    login_port: int = Field(22, gt=0, lt=65536, description="SSH port of the login node.")
    user: str = Field("root", min_length=1, description="User the pipeline logs in and submits jobs as.")
    host_key: str | None = Field(None, description="Pinned OpenSSH public host key of the login node.")
    host_key_file: str | None = Field(
        None, description="File holding the pinned host key (relative to the repository), instead of hostKey."
    )
    jail_root: str = Field("/", description="Where the shared filesystem (the jail) is mounted on login and workers.")
    nodes: int = Field(1, gt=0, description="Worker nodes the readiness checks and training spread over.")
    gpus_per_node: int = Field(0, ge=0, description="GPUs per worker node (0: CPU training with gloo).")
    cpus_per_node: int = Field(1, gt=0, description="CPUs per worker node, as Slurm counts them (its CPUs=).")
    memory_gib_per_node: int = Field(1, gt=0, description="Memory per worker node for jobs, GiB (Slurm's RealMemory).")

    @field_validator("jail_root")
    @classmethod
    def _absolute_jail(cls, value: str) -> str:
        if not PurePosixPath(value).is_absolute():
            raise ValueError(f"jail root {value!r} must be an absolute path on the cluster")
        if ".." in PurePosixPath(value).parts:
            raise ValueError(f"jail root {value!r} must not contain '..' (every run path is placed under it)")
        return str(PurePosixPath(value))

    @model_validator(mode="after")
    def _pinned(self) -> ExistingCluster:
        if (self.host_key is None) == (self.host_key_file is None):
            raise ValueError("pin the login node's host key: set exactly one of hostKey and hostKeyFile")
        return self

    def pinned_host_key(self, repo_root: Path) -> str:
        """The pinned host key line, read from hostKeyFile when that is how it is given."""
        if self.host_key is not None:
            return self.host_key
        path = Path(self.host_key_file or "")
        path = path if path.is_absolute() else repo_root / path
        try:
            return path.read_text().strip()
        except OSError as error:
            raise StackConfigError(f"cluster.hostKeyFile {path}: cannot read the pinned host key ({error.strerror})") from None


SLURM_PARTITION = r"^[a-z][a-z0-9_-]{0,30}$"
SERVING_HIDDEN = "hidden"


class ServingNodes(_Model):
    """Workers kept for serving (seed 000's dedicated worker): a Slurm partition of their own, where `serve` starts
    without waiting for training while readiness, train and eval run on the rest (`trainingPartition`)."""

    nodes: int = Field(0, ge=0, description="Workers reserved for serving: taken from the first worker set (nebius) "
                       "or the cluster's nodes (cluster); 0: serve shares the training nodes and waits for training.")
    partition: str = Field("serve", pattern=SLURM_PARTITION, description="Slurm partition of the serving workers.")
    training_partition: str = Field("main", pattern=SLURM_PARTITION, description="Slurm partition of the other "
                                    "workers (Soperator's default partition is named main).")

    @model_validator(mode="after")
    def _two_partitions(self) -> ServingNodes:
        if self.partition == self.training_partition:
            raise ValueError(f"partition and trainingPartition are both {self.partition!r}: serving needs its own")
        if SERVING_HIDDEN in (self.partition, self.training_partition):
            raise ValueError(f"{SERVING_HIDDEN!r} is Soperator's hidden partition over every node; pick another name")
        return self



def serving_fits(serving: ServingNodes, target: str, workers: list[WorkerSet], cluster_nodes: int | None) -> None:
    """Reserved serving workers leave at least one worker for training; raises naming the set and its size."""
    if serving.nodes == 0:
        return
    if target == "local":
        raise ValueError(f"serving.nodes {serving.nodes}: the local stack is one Slurm node; reserving it for "
                         "serving leaves none for training (set serving.nodes on a nebius or cluster stack)")
    if cluster_nodes is not None and serving.nodes >= cluster_nodes:
        raise ValueError(f"serving.nodes {serving.nodes} reserves every node of the cluster (cluster.nodes "
                         f"{cluster_nodes}): none would be left for training; give at most {cluster_nodes - 1}")
    if not workers:
        return
    first = workers[0]
    if serving.nodes >= first.size:
        raise ValueError(f"serving.nodes {serving.nodes} reserves every node of worker set {first.name!r} (size "
                         f"{first.size}): none would be left for training; give at most {first.size - 1}")
    if first.min_size is not None and first.min_size < serving.nodes:
        raise ValueError(f"serving.nodes {serving.nodes}: worker set {first.name!r} has minSize {first.min_size}, "
                         "but the serving NodeSet keeps its nodes up; raise minSize to at least serving.nodes")
    if (name := serving_nodeset_name(first.name)) in {w.name for w in workers}:
        raise ValueError(f"serving.nodes: the serving NodeSet would be named {name!r}, a worker set of that name exists")


def serving_nodeset_name(worker_set: str) -> str:
    """The NodeSet of the serving workers carved out of a worker set (its Slurm nodes are `<name>-<i>`)."""
    return f"{worker_set}-serve"


class StackConfig(_Model):
    stack: StackName
    target: Literal["nebius", "local", "cluster"]
    nebius: NebiusConfig | None = None
    cluster: ExistingCluster | None = None
    cluster_name: str = Field("slurm", pattern=r"^[a-z][a-z0-9-]{0,40}$")
    nodes: NodeSets | None = None
    filesystems: Filesystems | None = None
    buckets: Buckets | None = None
    soperator: SoperatorConfig | None = None
    ssh_public_keys: list[str] = []
    pipeline: PipelineConfig
    pricing: PricingConfig = PricingConfig()
    monitoring: MonitoringConfig = Field(
        MonitoringConfig(), description="Exporters, metrics store and dashboards; nebius stacks only, on by default."
    )
    serving: ServingNodes = Field(ServingNodes(), description="Workers reserved for serving (none by default).")

    @field_validator("ssh_public_keys")
    @classmethod
    def _keys_look_like_keys(cls, value: list[str]) -> list[str]:
        for i, key in enumerate(value):
            if not key.startswith(("ssh-", "ecdsa-", "sk-")) or len(key.split()) < 2:
                raise ValueError(f"entry {i} is not an OpenSSH public key")
        return value

    @model_validator(mode="after")
    def _target_sections(self) -> StackConfig:
        cloud = ("nebius", "nodes", "filesystems", "soperator")
        if self.target == "nebius":
            for key in cloud:
                if getattr(self, key) is None:
                    raise ValueError(f"{key}: required on a nebius stack")
            if not self.ssh_public_keys:
                raise ValueError("sshPublicKeys: a nebius stack needs at least one SSH public key for login")
        else:
            for key in (*cloud, "buckets"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}: a {self.target} stack creates no cloud resources; remove this key")
        if self.target != "nebius" and "monitoring" in self.model_fields_set:
            raise ValueError(f"monitoring: only a nebius stack installs monitoring; remove it from a {self.target} stack")
        if self.target == "cluster" and self.cluster is None:
            raise ValueError("cluster: required on a cluster stack (the existing Slurm cluster's login node)")
        if self.target == "local" and self.pipeline.environment is not None:
            raise ValueError("pipeline.environment: the local stack runs the repository's venv (installed from the "
                             "same lock by make venv); remove it")
        if self.target != "cluster" and self.cluster is not None:
            raise ValueError(f"cluster: only a cluster stack reaches an existing Slurm cluster; remove it from a {self.target} stack")
        if self.nodes and self.filesystems and self.filesystems.accounting and not self.nodes.accounting:
            raise ValueError("filesystems.accounting: set but nodes.accounting is not")
        if self.nodes and self.filesystems and self.nodes.accounting and not self.filesystems.accounting:
            raise ValueError("filesystems.accounting: required with nodes.accounting (MariaDB keeps its data there)")
        serving_fits(self.serving, self.target, self.nodes.workers if self.nodes else [],
                     self.cluster.nodes if self.cluster else None)
        if self.target == "nebius" and self.nebius and self.nodes and self.soperator:
            gpu_image_preconditions(self.nebius.k8s_version, self.nodes.workers, self.soperator.version)
        if self.target == "nebius" and self.buckets and self.buckets.backups.enabled and not (
            self.nebius and self.nebius.tenant_id
        ):
            raise ValueError("nebius.tenantId: required for jail backups (the backup service account joins "
                             "the tenant's editors group)")
        return self

    @property
    def environment(self) -> EnvironmentConfig | None:
        """The environment the pipeline builds on the cluster; None on the local stack (the repository's venv)."""
        if self.target == "local":
            return None
        return self.pipeline.environment or EnvironmentConfig()

    @property
    def cuda_version(self) -> str | None:
        """The one CUDA version of the GPU worker sets (passed to Soperator's charts), None without GPUs."""
        found = sorted({w.node_cuda_version for w in self.nodes.workers if w.node_cuda_version}) if self.nodes else []
        return found[0] if found else None

    @property
    def monitoring_on(self) -> bool:
        """Whether the monitoring releases and their cost lines are part of this stack."""
        return self.target == "nebius" and self.monitoring.enabled

    @property
    def gpu_workers(self) -> bool:
        """Whether the training workers have GPUs: the first worker set's preset, or the cluster's gpusPerNode."""
        if self.cluster is not None:
            return self.cluster.gpus_per_node > 0
        return bool(self.nodes and self.nodes.workers and self.nodes.workers[0].shape.gpus)

    @property
    def serving_on(self) -> bool:
        """Whether workers are reserved for serving (serve then runs in its own partition)."""
        return self.serving.nodes > 0

    @property
    def slurm_namespace(self) -> str:
        """The Slurm cluster's namespace (Soperator's, on a nebius stack); ``clusterName`` labels the cloud resources."""
        return self.soperator.namespace if self.soperator else self.cluster_name

    @property
    def slurm_cluster_name(self) -> str:
        """The SlurmCluster's name (Soperator's, on a nebius stack)."""
        return self.soperator.slurm_cluster_name if self.soperator else self.cluster_name

    def plan_stack(self) -> PlanStack:
        """What the planner reads of this stack (planning.stack)."""
        workers = [PlanWorkerSet(name=w.name, platform=w.platform, preset=w.preset, size=w.size,
                                 preemptible=w.preemptible, elastic=w.elastic, boot_disk_type=w.boot_disk.type,
                                 boot_disk_gib=w.boot_disk.size_gib) for w in (self.nodes.workers if self.nodes else [])]
        cluster = (ExistingNodes(nodes=self.cluster.nodes, gpus_per_node=self.cluster.gpus_per_node,
                                 cpus_per_node=self.cluster.cpus_per_node,
                                 memory_gib_per_node=self.cluster.memory_gib_per_node) if self.cluster else None)
        return PlanStack(stack=self.stack, target=self.target, workers=workers, cluster=cluster,
                         serving_nodes=self.serving.nodes, serving_partition=self.serving.partition,
                         training_partition=self.serving.training_partition, pricing=self.pricing)


def gpu_image_preconditions(k8s_version: str, workers: list[WorkerSet], soperator_version: str) -> None:
    """The reference install's ``check_driver_presets`` preconditions (catalog.REFERENCE_DRIVER_PRESETS), plus the
    CUDA versions the pinned Soperator has images for; raises with every failed one, naming what is listed."""
    table = catalog.SUPPORTED_DRIVER_PRESETS_BY_K8S
    offered = table.get(k8s_version, {})
    gpu = [w for w in workers if w.shape.gpus]
    preinstalled = [w for w in gpu if w.gpu_drivers == "nebius-preset"]
    cudas = sorted({w.node_cuda_version for w in gpu})
    presets = sorted({w.node_drivers_preset for w in preinstalled})
    images = catalog.SOPERATOR_CUDA_VERSIONS.get(soperator_version)
    failed = []
    if k8s_version not in table:
        failed.append(f"nebius.k8sVersion {k8s_version}: no preinstalled GPU images for this Kubernetes version; "
                      f"supported versions: {', '.join(sorted(table))}")
    if unlisted := sorted({w.platform for w in preinstalled if w.platform not in offered}):
        failed.append(f"nodes.workers: GPU platform(s) {', '.join(unlisted)} have no preinstalled images for "
                      f"Kubernetes {k8s_version}")
    failed += [f"nodes.workers {w.name}: driversPreset {w.node_drivers_preset} is not offered for {w.platform} on "
               f"Kubernetes {k8s_version} (offered: {', '.join(offered[w.platform])})"
               for w in preinstalled if w.platform in offered and w.node_drivers_preset not in offered[w.platform]]
    if len(cudas) > 1:
        failed.append(f"nodes.workers: all worker sets must use the same CUDA version; found {', '.join(cudas)}")
    if len(presets) > 1:
        failed.append(f"nodes.workers: all worker sets must use the same drivers preset; found {', '.join(presets)}")
    if images is not None and (unshipped := [c for c in cudas if c not in images]):
        failed.append(f"cudaVersion {', '.join(unshipped)}: Soperator {soperator_version} ships images for CUDA "
                      f"{', '.join(images)} only")
    if failed:
        listed = f"listed ({catalog.REFERENCE_DRIVER_PRESETS}): {catalog.supported_pairs()}"
        raise ValueError("; ".join(failed) + f"; {listed}")


def _decode(field: str, raw: Any) -> Any:
    """Pulumi hands every config value over as a string; objects, lists and bools are JSON."""
    if not isinstance(raw, str) or field in ("target", "clusterName"):
        return raw
    try:
        return load_json(raw, field)
    except TextInputError:
        return raw


def _format_errors(error: ValidationError, source: str) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {PROJECT}:{key}: {message}" if key else f"  {PROJECT}:{message}")
    return f"{source}: invalid stack config\n" + "\n".join(lines)


def parse_stack_config(stack_name: str, values: dict[str, Any], source: str) -> StackConfig:
    """Validate namespace-stripped config values; errors name ``source`` and each bad key."""
    data = {key: _decode(key, raw) for key, raw in values.items()}
    try:
        return StackConfig.model_validate({"stack": stack_name, **data})
    except ValidationError as exc:
        raise StackConfigError(_format_errors(exc, source)) from None


def split_namespace(config: dict[str, Any], source: str) -> tuple[dict[str, Any], set[str]]:
    """Project keys (namespace stripped) and the names of the ``secure:`` ones among them."""
    values: dict[str, Any] = {}
    secrets: set[str] = set()
    unknown = sorted(str(k) for k in config if str(k).partition(":")[0] not in KNOWN_NAMESPACES)
    if unknown:
        raise StackConfigError(f"{source}: keys under an unknown namespace: {', '.join(unknown)} "
                               f"(this project's keys start with '{PROJECT}:'; known: {', '.join(KNOWN_NAMESPACES)})")
    for full_key, value in config.items():
        namespace, _, key = full_key.partition(":")
        if namespace != PROJECT:
            continue
        if isinstance(value, dict) and set(value) == {"secure"}:
            secrets.add(key)
            continue
        values[key] = value
    unknown_secrets = secrets - set(SECRET_KEYS)
    if unknown_secrets:
        raise StackConfigError(f"{source}: unknown secret keys: {', '.join(sorted(unknown_secrets))}")
    plain_secrets = set(SECRET_KEYS) & set(values)
    if plain_secrets:
        raise StackConfigError(
            f"{source}: {', '.join(sorted(plain_secrets))} must be a secure value (pulumi config set --secret)"
        )
    return values, secrets


def stack_file(stack_name: str, config_dir: str | Path = "stacks") -> Path:
    try:
        checked_name(stack_name, "stack name")
    except ValueError as error:
        raise StackConfigError(str(error)) from None
    return Path(config_dir) / f"Pulumi.{stack_name}.yaml"


def read_stack_file(stack_name: str, config_dir: str | Path = "stacks") -> tuple[StackConfig, set[str]]:
    """StackConfig of a stack file plus the names of its secure keys (their values stay encrypted)."""
    path = stack_file(stack_name, config_dir)
    if not path.is_file():
        raise StackConfigError(f"{path}: no such stack file")
    try:
        document = yaml.safe_load(read_utf8(path)) or {}
    except TextInputError as exc:
        raise StackConfigError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise StackConfigError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:
        raise StackConfigError(f"{path}: YAML nested too deeply") from None
    if not isinstance(document, dict):
        raise StackConfigError(f"{path}: the file must be a mapping with a 'config' key, not a {type(document).__name__}")
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise StackConfigError(f"{path}: 'config' must be a mapping")
    values, secrets = split_namespace(config, str(path))
    return parse_stack_config(stack_name, values, str(path)), secrets


def load_stack_config(stack_name: str, config_dir: str | Path = "stacks") -> StackConfig:
    """Offline read of ``<config_dir>/Pulumi.<stack>.yaml`` (no Pulumi CLI needed)."""
    return read_stack_file(stack_name, config_dir)[0]


def from_pulumi_config() -> StackConfig:
    """StackConfig of the running Pulumi program (its config and stack name)."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    everything = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    prefix = f"{PROJECT}:"
    values = {
        key.removeprefix(prefix): value
        for key, value in everything.items()
        if key.startswith(prefix) and key.removeprefix(prefix) not in SECRET_KEYS
    }
    return parse_stack_config(pulumi.get_stack(), values, f"stack {pulumi.get_stack()!r}")


def load_run(cfg: StackConfig, root: Path = REPO_ROOT) -> RunConfig | None:
    """The stack's run config (pipeline.runConfig, relative to `root`), or None where it is not readable here."""
    path = Path(cfg.pipeline.run_config)
    path = path if path.is_absolute() else root / path
    return load_run_config(path) if path.is_file() else None


def find_repo_root(start: Path | None = None) -> Path:
    """The nearest directory holding Pulumi.yaml (or .git), from `start` (default: cwd) upwards."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "Pulumi.yaml").is_file() or (candidate / ".git").exists():
            return candidate
    return here
