"""Pure construction of the Helm releases that install Soperator, and of their values.

Key names follow the charts of the pinned Soperator release (nebius/soperator ``helm/``):
``helm-soperator``, ``helm-slurm-cluster-storage``, ``helm-slurm-cluster`` and ``helm-nodesets``.
Values may carry Pulumi inputs (ids, sizes) where they come from other resources. The tests render every release
with the real Helm from the pinned charts and check what it creates (tests/test_helm_render.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from planning import catalog
from infra.config import SERVING_HIDDEN, SoperatorConfig, StackConfig, serving_nodeset_name
from infra.monitoring import releases as mon
from infra.nebius.layout import (
    ACCOUNTING,
    CONTROLLER_SPOOL,
    JAIL,
    LABEL_JAIL,
    LABEL_NODESET,
    NodeGroupSpec,
    layout,
    submount_tag,
)
from infra.soperator import active_checks, helm_values

ALLOCATION_ANNOTATION = "nebius.com/load-balancer-allocation-id"
SOPERATOR_NAMESPACE = "soperator-system"
STORAGE_CLASS = "compute-csi-network-ssd-ext4"
LOCAL_PV_CLASS = "slurm-local-pv"
"""Storage class of the filestore PVs of helm-slurm-cluster-storage (values.yaml storageClass.local.name)."""
K8UP_NAMESPACE = "k8up-system"
BACKUP_SECRET = "jail-backup"
BACKUP_SCHEDULE = "soperator-jail"
WORKER_SPOOL_GIB = 64
KRUISE_FEATURE_GATES = ",".join((
    "ImagePullJobGate=true", "RecreatePodWhenChangeVCTInCloneSetGate=true",
    "StatefulSetAutoResizePVCGate=true", "StatefulSetAutoDeletePVC=true",
    "PreDownloadImageForInPlaceUpdate=true", "ResourceDistributionGate=true",
))
MUNGE_CPU_M, MUNGE_MEMORY_GIB, MUNGE_EPHEMERAL_GIB = 1000, 1, 5
SERVICE_MUNGE_CPU_M = 500
DAEMONSET_CPU_M, DAEMONSET_MEMORY_GIB = 500, 4
K8S_EPHEMERAL_RESERVE_GIB = 48
SLURM_CLUSTER_DELETIONS: tuple[helm_values.Path, ...] = (
    ("slurmNodes", "controller", "volumes", "spool", "volumeClaimTemplateSpec"),
)
"""The controller's spool comes from the controller-spool filestore (``volumeSourceName``); the chart's default 50 GiB
``volumeClaimTemplateSpec`` (helm/slurm-cluster/values.yaml) would otherwise stay beside it, and the CRD's NodeVolume
takes one source only (api/v1/slurmcluster_types.go)."""
POPULATE_FILTER = "system"
"""populateJail runs on the system nodes, as the reference's ``populate_jail.k8s_node_filter_name`` defaults: never on a
worker set, which may be GPU VMs scaled to zero."""
SLURM_SCRIPTS_CONFIGMAPS = {"4.1.7": "slurm-scripts", "5.0.0": "{cluster}-slurm-scripts"}
"""The chart's scripts ConfigMap per Soperator version: helm/slurm-cluster 4.1.7 templates/slurm-scripts-cm.yaml:5
names it ``slurm-scripts``; 5.0.0 (main at c238d993) names it ``slurm-cluster.slurmScriptsCMName``, the cluster name
and ``-slurm-scripts`` (templates/_helpers.tpl:28-30)."""
SLURM_SCRIPTS_DIR = "/opt/slurm_scripts/"
JAIL_UPPER = "/mnt/jail.upper"
BUSYBOX_IMAGE = "cr.nebius.cloud/soperator/busybox"
NODE_EXTRA = '"{ \\"ib_pod\\": \\"$TOPO_SWITCH_TIER2\\", \\"ib_su\\": \\"$TOPO_SWITCH_TIER1\\" }"'
"""``nodeConfig.dynamic``, the reference's ``slurm_node_extra`` (modules/slurm/locals.tf) after Terraform's and YAML's
unescaping. The operator passes it as SLURM_NODE_EXTRA; images/worker/slurmd_entrypoint.sh (4.1.7, lines 34-62)
sets TOPO_SWITCH_TIER1/2 from the node's topology labels (``unknown`` without) and starts slurmd with
``--extra "$(eval echo "$SLURM_NODE_EXTRA")"``: the node's Extra is then JSON such as
``{ "ib_pod": "unknown", "ib_su": "unknown" }``."""
NODESETS_CLUSTER_NAME = frozenset({"5.0.0"})
"""Soperator versions whose helm-nodesets needs ``clusterName``: 5.0.0 (main at c238d993) sets spec.clusterName from
it (templates/nodeset.yaml:22; values.yaml:8 defaults to ""); 4.1.7 has no such value (its mutating webhook filled
the name)."""
_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "PREFER_NO_SCHEDULE": "PreferNoSchedule", "NO_EXECUTE": "NoExecute"}


@dataclass(frozen=True)
class ReleaseSpec:
    """One Helm release: where its chart comes from, its namespace, values and predecessors.

    ``values`` may hold no None (Pulumi's Python SDK would drop it); a chart default to remove is a path in ``deletions``, sent as
    ``key: null`` through ``value_yaml_files``.
    """

    key: str
    chart: str
    version: str
    namespace: str
    values: dict[str, Any] = field(hash=False)
    repo: str | None = None
    skip_crds: bool = False
    depends_on: tuple[str, ...] = ()
    timeout_s: int = 1200
    """How long Helm waits for the release's resources, jobs and hooks."""
    deletions: tuple[helm_values.Path, ...] = ()
    """Chart defaults this release removes (each a key path)."""
    release_name: str | None = None
    """The Helm release's name where it is not ``key`` (the chart's folder)."""

    @property
    def name(self) -> str:
        return self.release_name or self.key

    def __post_init__(self) -> None:
        if nulls := helm_values.null_paths(self.values):
            raise ValueError(f"release {self.key}: None at {', '.join(nulls)} would never reach Helm (Pulumi drops it); "
                             "list a chart default to remove in deletions")

    def helm_document(self) -> dict[str, Any]:
        """The values Helm receives: the deletions as nulls under ``values``."""
        return helm_values.merged(helm_values.deletion_document(self.deletions), self.values)



def chart_ref(registry: str, chart_dir: str) -> str:
    return f"oci://{registry}/helm-{chart_dir}"


def gib(size: Any) -> Any:
    """``256`` -> ``"256Gi"``; Pulumi outputs are mapped the same way."""
    if hasattr(size, "apply"):
        return size.apply(lambda n: f"{n}Gi")
    return f"{size}Gi"


def node_filter(spec: NodeGroupSpec) -> dict[str, Any]:
    """A k8s node filter pinning pods to one node group and tolerating its taints."""
    return {
        "name": spec.name,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": LABEL_NODESET, "operator": "In", "values": [spec.name]}
            ]}]
        }}},
        "tolerations": [
            {"key": t.key, "operator": "Exists", "effect": _EFFECTS[t.effect]} for t in spec.taints
        ],
    }


@dataclass(frozen=True)
class Budget:
    """Resources one node offers to pods: allocatable minus Kubernetes and daemonset reserves."""

    cpu_m: int
    memory_gib: int
    ephemeral_gib: int

    def less(self, *others: Budget) -> Budget:
        return Budget(self.cpu_m - sum(o.cpu_m for o in others), self.memory_gib - sum(o.memory_gib for o in others),
                      self.ephemeral_gib - sum(o.ephemeral_gib for o in others))

    def share(self, fraction: float) -> Budget:
        return Budget(int(self.cpu_m * fraction) // 100 * 100, math.floor(self.memory_gib * fraction),
                      math.floor(self.ephemeral_gib * fraction))

    def values(self) -> dict[str, str]:
        """The charts' resource keys (``ephemeralStorage`` becomes ``ephemeral-storage`` in the CR)."""
        return {"cpu": f"{self.cpu_m}m", "memory": f"{self.memory_gib}Gi", "ephemeralStorage": f"{self.ephemeral_gib}Gi"}


def node_budget(spec: NodeGroupSpec) -> Budget:
    """What pods may request on one node of ``spec``: mk8s allocatable less the daemonsets' share."""
    shape = spec.shape
    return Budget(
        cpu_m=(shape.vcpus - 1) * 1000 - DAEMONSET_CPU_M,
        memory_gib=math.floor(shape.ram_gib * 0.95) - 2 - DAEMONSET_MEMORY_GIB,
        ephemeral_gib=math.floor(spec.boot_disk.size_gib * 0.85) - K8S_EPHEMERAL_RESERVE_GIB,
    )


WORKER_MUNGE = Budget(MUNGE_CPU_M, MUNGE_MEMORY_GIB, MUNGE_EPHEMERAL_GIB)
SERVICE_MUNGE = Budget(SERVICE_MUNGE_CPU_M, MUNGE_MEMORY_GIB, MUNGE_EPHEMERAL_GIB)
WORKER_SPOOL = Budget(0, 0, WORKER_SPOOL_GIB)


@dataclass(frozen=True)
class SlurmdResources:
    cpu_m: int
    memory_gib: int
    ephemeral_gib: int
    gpus: int
    shared_memory_gib: int


def slurmd_resources(spec: NodeGroupSpec) -> SlurmdResources:
    """What is left for slurmd on one worker after Kubernetes, daemonsets, munge and the spool emptyDir."""
    left = node_budget(spec).less(WORKER_MUNGE, WORKER_SPOOL)
    return SlurmdResources(
        cpu_m=left.cpu_m, memory_gib=left.memory_gib, ephemeral_gib=left.ephemeral_gib,
        gpus=spec.gpus, shared_memory_gib=max(1, spec.shape.ram_gib // 4),
    )


def _match(key: str, values: list[str]) -> list[dict[str, Any]]:
    return [{"key": key, "operator": "In", "values": values}]


def cert_manager_values() -> dict[str, Any]:
    return {"crds": {"enabled": True}}


def kruise_values() -> dict[str, Any]:
    """The release creates ``kruise-system``; the chart must not render it too (it defaults to true)."""
    return {"featureGates": KRUISE_FEATURE_GATES, "crds": {"managed": True}, "installation": {"createNamespace": False}}


def mariadb_operator_values() -> dict[str, Any]:
    return {"webhook": {"cert": {"certManager": {"enabled": True}}}, "metrics": {"enabled": False}}


def soperator_values(cfg: StackConfig) -> dict[str, Any]:
    """The operator: cert-manager webhooks, Kruise installed separately; Prometheus CRDs only with monitoring."""
    accounting = bool(cfg.nodes and cfg.nodes.accounting)
    return {
        "certManager": {"enabled": True},
        "kruise": {"installOperator": False},
        "serviceMonitor": {"enabled": cfg.monitoring_on},
        "controllerManager": {"manager": {"env": {
            "isMariadbCrdInstalled": "true" if accounting else "false",
            "isPrometheusCrdInstalled": "true" if cfg.monitoring_on else "false",
        }}},
    }


def storage_values(cfg: StackConfig, size_gib: dict[str, Any]) -> dict[str, Any]:
    """Filestores as local PVs/PVCs; ``size_gib`` maps mount tag to size. Without an accounting filestore the chart
    reads nothing of its volume and placement but ``enabled`` (templates/accounting-*.yaml render only when on)."""
    fs = cfg.filesystems
    assert fs is not None
    everywhere = [{"operator": "Exists"}]
    accounting_groups = ["controller", "accounting"] if cfg.nodes and cfg.nodes.accounting else ["controller"]
    accounting = ({"enabled": True, "name": ACCOUNTING, "size": gib(size_gib.get(ACCOUNTING, 1)),
                   "filestoreDeviceName": ACCOUNTING} if fs.accounting is not None else {"enabled": False})
    placement = {"accounting": {"matchExpressions": _match(LABEL_NODESET, accounting_groups),
                                "tolerations": everywhere}} if fs.accounting is not None else {}
    return {
        "volume": {
            "jail": {"name": JAIL, "size": gib(size_gib[JAIL]), "type": "filestore", "filestoreDeviceName": JAIL},
            "controllerSpool": {
                "name": CONTROLLER_SPOOL, "size": gib(size_gib[CONTROLLER_SPOOL]),
                "filestoreDeviceName": CONTROLLER_SPOOL,
            },
            "accounting": accounting,
            "jailSubMounts": [
                {"name": s.name, "size": gib(size_gib[submount_tag(s.name)]), "filestoreDeviceName": submount_tag(s.name)}
                for s in fs.submounts
            ],
        },
        "storage": {
            "jail": {"matchExpressions": _match(LABEL_JAIL, ["true"]), "tolerations": everywhere},
            "controllerSpool": {"matchExpressions": _match(LABEL_NODESET, ["controller"]), "tolerations": everywhere},
            **placement,
        },
    }


def _pvc_source(name: str, claim: str) -> dict[str, Any]:
    return {"name": name, "createPVC": False, "persistentVolumeClaim": {"claimName": claim, "readOnly": False}}


def _hopper_only(specs: list[NodeGroupSpec]) -> bool:
    return all(s.shape.gpu_cluster_compatible for s in specs if s.role == "worker")


def _role(specs: list[NodeGroupSpec], role: str) -> NodeGroupSpec | None:
    return next((s for s in specs if s.role == role), None)


def mariadb_storage(size: Any) -> dict[str, Any]:
    """A claim that binds the accounting filestore PV of helm-slurm-cluster-storage (class slurm-local-pv,
    ReadWriteMany, no claimRef), so MariaDB keeps its data on the accounting filesystem."""
    return {"ephemeral": False, "volumeClaimTemplate": {
        "storageClassName": LOCAL_PV_CLASS, "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": gib(size)}},
    }}


def _accounting(specs: list[NodeGroupSpec], size_gib: dict[str, Any]) -> dict[str, Any]:
    node = _role(specs, "accounting")
    if node is None:
        return {"enabled": False, "k8sNodeFilterName": "controller", "mariadbOperator": {"enabled": False}}
    left = node_budget(node).less(SERVICE_MUNGE)
    slurmdbd = left.share(1 / 3)
    return {
        "enabled": True,
        "k8sNodeFilterName": "accounting",
        "slurmdbd": {"resources": slurmdbd.values()},
        "munge": {"resources": SERVICE_MUNGE.values()},
        "customInitContainers": virtiofs_checks([]),
        "mariadbOperator": {
            "enabled": True, "metrics": {"enabled": False},
            "resources": left.less(slurmdbd).values(),
            "storage": mariadb_storage(size_gib[ACCOUNTING]),
        },
    }


def slurm_cluster_values(cfg: StackConfig, specs: list[NodeGroupSpec], allocation_id: Any,
                         size_gib: dict[str, Any]) -> dict[str, Any]:
    """The SlurmCluster CR: node filters, jail and submounts, controller, login, accounting."""
    nodes, fs = cfg.nodes, cfg.filesystems
    assert nodes is not None and fs is not None
    controller, login = _role(specs, "controller"), _role(specs, "login")
    assert controller is not None and login is not None
    cuda = {"cudaVersion": cfg.cuda_version} if cfg.cuda_version is not None else {}
    return {
        "clusterName": cfg.slurm_cluster_name,
        **cuda,
        **slurm_config_values(cfg),
        **partition_values(cfg),
        "k8sNodeFilters": [node_filter(s) for s in specs],
        "volumeSources": [
            _pvc_source(CONTROLLER_SPOOL, f"{CONTROLLER_SPOOL}-pvc"),
            _pvc_source(JAIL, f"{JAIL}-pvc"),
            *(_pvc_source(submount_tag(s.name), f"{submount_tag(s.name)}-pvc") for s in fs.submounts),
        ],
        "populateJail": {"k8sNodeFilterName": POPULATE_FILTER},
        "slurmNodes": {
            "accounting": _accounting(specs, size_gib),
            "controller": {
                "k8sNodeFilterName": "controller",
                "slurmctld": {"resources": node_budget(controller).less(SERVICE_MUNGE).values()},
                "munge": {"resources": SERVICE_MUNGE.values()},
                "customInitContainers": virtiofs_checks([]),
                "volumes": {
                    "spool": {"volumeSourceName": CONTROLLER_SPOOL},
                    "jail": {"volumeSourceName": JAIL},
                },
                "openMetrics": {"enabled": cfg.monitoring_on},
            },
            "login": {
                "size": nodes.login.size,
                "k8sNodeFilterName": "login",
                "sshd": {"resources": node_budget(login).less(SERVICE_MUNGE).values()},
                "munge": {"resources": SERVICE_MUNGE.values()},
                "customInitContainers": virtiofs_checks([s.name for s in fs.submounts]),
                "sshRootPublicKeys": list(cfg.ssh_public_keys),
                "sshdServiceType": "LoadBalancer",
                "sshdServiceAnnotations": {ALLOCATION_ANNOTATION: allocation_id},
                "volumes": {
                    "jail": {"volumeSourceName": JAIL},
                    "jailSubMounts": [
                        {"name": s.name, "mountPath": s.mount_path, "volumeSourceName": submount_tag(s.name)}
                        for s in fs.submounts
                    ],
                },
            },
            "exporter": {"enabled": cfg.monitoring_on, "k8sNodeFilterName": "system"},
        },
        "sConfigController": {"node": {"k8sNodeFilterName": "system"}, "serviceMonitor": {"enabled": cfg.monitoring_on}},
        "slurmScripts": {"builtIn": {
            "gpu_health_check.py": {"enabled": _hopper_only(specs)},
            **({script: {"enabled": True} for script in mon.DCGM_SCRIPTS} if cfg.monitoring_on else {}),
        }},
    }


def nodeset_values(cfg: StackConfig, spec: NodeGroupSpec) -> dict[str, Any]:
    """One NodeSet CR: replicas, GPUs, slurmd resources, jail and submounts, placement."""
    fs = cfg.filesystems
    assert fs is not None
    res = slurmd_resources(spec)
    gpu = res.gpus > 0
    slurmd_res: dict[str, Any] = {
        "cpu": f"{res.cpu_m}m", "memory": f"{res.memory_gib}Gi", "ephemeralStorage": f"{res.ephemeral_gib}Gi",
    }
    if gpu:
        slurmd_res["gpu"] = res.gpus
    filt = node_filter(spec)
    return {
        "name": spec.name,
        "replicas": spec.size,
        "maxUnavailable": 1,
        **ephemeral_values(cfg, spec),
        "gpu": {"enabled": gpu, "nvidia": {"gdrCopyEnabled": spec.fabric is not None}} if gpu else {"enabled": False},
        "nodeConfig": {
            "features": ["gpu", spec.platform] if gpu else ["cpu"],
            "static": node_static(spec),
            "dynamic": NODE_EXTRA,
            **({"gresConfig": ["AutoDetect=nvidia"]} if gpu else {}),
        },
        "slurmd": {
            "resources": slurmd_res,
            "volumes": {
                # The NodeSet CRD types spool as a corev1.VolumeSource: a bounded emptyDir on the boot disk
                # (its size is taken out of slurmd's ephemeral storage above).
                "spool": {"emptyDir": {"sizeLimit": f"{WORKER_SPOOL_GIB}Gi"}},
                "jail": {"persistentVolumeClaim": {"claimName": f"{JAIL}-pvc"}},
                "jailSubMounts": [
                    {"name": s.name, "mountPath": s.mount_path, "readOnly": False,
                     "volumeSource": {"persistentVolumeClaim": {"claimName": f"{submount_tag(s.name)}-pvc"}}}
                    for s in fs.submounts
                ],
                "customVolumeMounts": custom_volume_mounts(cfg, spec),
                "sharedMemorySize": f"{res.shared_memory_gib}Gi",
            },
        },
        "munge": {"resources": WORKER_MUNGE.values()},
        "enableHostUserNamespace": True,
        "priorityClass": "soperator-worker-high-priority",
        "affinity": filt["affinity"],
        "tolerations": filt["tolerations"],
        "customInitContainers": virtiofs_checks([s.name for s in fs.submounts]),
    }


def virtiofs_checks(submounts: list[str]) -> list[dict[str, Any]]:
    """Init containers that stop a pod from starting before its jail and ``submounts`` are the node's virtiofs
    filestores (not an empty directory of the node), as the reference adds them to workers, login, controller and
    accounting (flux_release_nodesets.yaml.tftpl, terraform_fluxcd_values.yaml.tftpl)."""
    # the pod's volumes: "jail" (internal/consts/volume.go:40), each submount by its name (render/worker/volume.go:68)
    volumes = [("jail-virtiofs", "jail"), *((f"jail-submount-{name}-virtiofs", name) for name in submounts)]
    return [{"name": f"ensure-{name}", "image": BUSYBOX_IMAGE,
             "volumeMounts": [{"name": volume, "mountPath": "/volume-mount"}],
             "command": ["grep", " /volume-mount virtiofs ", "/proc/mounts"]} for name, volume in volumes]


def node_static(spec: NodeGroupSpec) -> str:
    """A NodeSet's ``nodeConfig.static``: the VM's CPU topology and, on a GPU set, ``Gres=gpu:<type>:<n>``, as the
    reference's flux_release_nodesets.yaml.tftpl joins them. Soperator 4.1.7 appends it to each node's
    ``NodeName=`` line after NodeHostname, NodeAddr, RealMemory and Feature (configmap.go:140-176, dropping only
    ``Feature=`` and ``State=`` words); without it Slurm knows no CPU layout and no GPU on the node."""
    line = catalog.cpu_topology(spec.platform, spec.preset).slurm()
    if spec.gpus > 0:
        line += f" Gres=gpu:{catalog.gres_name(spec.platform)}:{spec.gpus}"
    return line


def custom_volume_mounts(cfg: StackConfig, spec: NodeGroupSpec) -> list[dict[str, Any]]:
    """The worker's extra mounts, as the reference's flux_release_nodesets.yaml.tftpl sends them on every NodeSet:
    the chart's scripts ConfigMap (``SLURM_SCRIPTS_CONFIGMAPS``; the prolog, epilog and HealthCheckProgram are
    ``/opt/slurm_scripts/*.sh``, helm/slurm-cluster 4.1.7 templates/slurm-cluster-cr.yaml:38, and the operator
    mounts the ConfigMap on login pods only) at /opt/slurm_scripts/ and in the jail's upper layer,
    the host's /sys as ``sys-host``, the DCGM per-job map directory where job mapping is on (map_job_dcgm.sh runs
    outside the jail and writes ``HPC_JOB_MAP_DIR``, which the exporter reads from the host), and the driver root
    where the node image brings the GPU drivers (``use_preinstalled_drivers``)."""
    assert cfg.soperator is not None
    if (template := SLURM_SCRIPTS_CONFIGMAPS.get(cfg.soperator.version)) is None:
        raise ValueError(f"soperator.version {cfg.soperator.version}: the slurm-scripts ConfigMap's name is not known; "
                         f"known for {', '.join(SLURM_SCRIPTS_CONFIGMAPS)} (read helm/slurm-cluster at that tag)")
    configmap = template.format(cluster=cfg.slurm_cluster_name)
    scripts = {"configMap": {"name": configmap, "defaultMode": 0o755}}
    mounts: list[dict[str, Any]] = [
        {"name": "slurm-scripts", "mountPath": SLURM_SCRIPTS_DIR, "volumeSource": scripts},
        {"name": "slurm-scripts-jail", "mountPath": f"{JAIL_UPPER}{SLURM_SCRIPTS_DIR}", "volumeSource": scripts},
        {"name": "sys-host", "mountPath": f"{JAIL_UPPER}/sys-host", "readOnly": True,
         "volumeSource": {"hostPath": {"path": "/sys", "type": "Directory"}}},
    ]
    if cfg.monitoring_on:
        mounts.append({"name": "hpc-jobs-dir", "mountPath": mon.HPC_JOB_MAP_DIR,
                       "volumeSource": {"hostPath": {"path": mon.HPC_JOB_MAP_DIR, "type": "DirectoryOrCreate"}}})
    if spec.gpus > 0 and spec.drivers_preset is not None:
        mounts.append({"name": "nvidia-driver-root", "mountPath": "/run/nvidia/driver", "readOnly": False,
                       "volumeSource": {"hostPath": {"path": "/", "type": ""}}})
    return mounts


def ephemeral_values(cfg: StackConfig, spec: NodeGroupSpec) -> dict[str, Any]:
    """A worker set's ephemeral-node keys of the NodeSet (helm/nodesets at 4.1.7 renders each only when given)."""
    worker = next((w for w in cfg.nodes.workers if w.name == spec.name), None) if cfg.nodes else None
    if worker is None or not worker.ephemeral:
        return {}
    optional = (("initialNumberEphemeralNodes", worker.initial_active),
                ("ephemeralTopologyWaitTimeout", worker.topology_wait_seconds))
    return {"ephemeralNodes": True, **{key: value for key, value in optional if value is not None}}


def slurm_config_values(cfg: StackConfig) -> dict[str, Any]:
    """SlurmCluster slurmConfig: suspendTime where a worker set is ephemeral (the CRD default never powers down)."""
    if cfg.nodes is None or not any(w.ephemeral for w in cfg.nodes.workers) or cfg.soperator is None:
        return {}
    return {"slurmConfig": {"suspendTime": cfg.soperator.suspend_time_seconds}}


MAIN_PARTITION_CONFIG = "Default=YES PriorityTier=10 MaxTime=INFINITE State=UP OverSubscribe=YES"
HIDDEN_PARTITION_CONFIG = "Default=NO PriorityTier=10 PreemptMode=OFF Hidden=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
SERVING_PARTITION_CONFIG = "Default=NO PriorityTier=10 MaxTime=INFINITE State=UP OverSubscribe=NO"
"""main and hidden as Soperator 4.1.7 writes its default partitions (internal/render/common/configmap.go:384-385),
the training one over the training NodeSets; the serving one never shared by two jobs."""
HOUSEKEEPING = "housekeeping"
"""The NodeSet and partition of the pipeline's housekeeping (the environment build): one slurmd on the system nodes,
which exist anyway, so that housekeeping never wakes an elastic GPU set nor pays for a VM of its own."""
HOUSEKEEPING_SLURMD = Budget(1000, 6, 16)
"""slurmd's CPU (millicores), memory and ephemeral storage (GiB) on a system node: an environment build with uv."""
HOUSEKEEPING_SPOOL_GIB = 8
HOUSEKEEPING_PARTITION_CONFIG = "Default=NO PriorityTier=10 MaxTime=INFINITE State=UP OverSubscribe=YES"


def partition_values(cfg: StackConfig) -> dict[str, Any]:
    """SlurmCluster partitionConfiguration: structured, as the reference always sends it (terraform_fluxcd_values
    .yaml.tftpl ``partitionConfiguration.configType: structured``), since Soperator 4.1.7 writes a NodeSet's
    ``NodeName=`` lines only then (internal/render/common/configmap.go:369-372; the default branch, 381-383, writes
    two ``Nodes=ALL`` partitions and no node, so slurmd finds no line for itself). The main partition over every
    training NodeSet; Soperator's hidden one over every worker NodeSet but housekeeping (not ``isAll``, as the
    reference sends it: the active checks with ``eachWorkerJobs`` submit a GPU job to every responding node of
    ``hidden``, images/slurm_check_job/slurm_submit_jobs.sh:5,23 at 4.1.7, and one on a CPU node fails the check);
    the housekeeping one over its NodeSet; with workers reserved for serving, the serving one over the serving
    NodeSet. Nothing without worker sets."""
    if cfg.nodes is None or not cfg.nodes.workers:
        return {}
    training = [w.name for w in cfg.nodes.workers]
    serving = [serving_nodeset_name(cfg.nodes.workers[0].name)] if cfg.serving_on else []
    partitions: list[dict[str, Any]] = [
        {"name": cfg.serving.training_partition, "nodeSetRefs": training, "config": MAIN_PARTITION_CONFIG},
        {"name": SERVING_HIDDEN, "nodeSetRefs": training + serving, "config": HIDDEN_PARTITION_CONFIG},
        {"name": HOUSEKEEPING, "nodeSetRefs": [HOUSEKEEPING], "config": HOUSEKEEPING_PARTITION_CONFIG},
    ]
    if serving:
        partitions.append({"name": cfg.serving.partition, "nodeSetRefs": serving, "config": SERVING_PARTITION_CONFIG})
    return {"partitionConfiguration": {"configType": "structured", "partitions": partitions}}


def worker_nodesets(cfg: StackConfig, spec: NodeGroupSpec) -> list[dict[str, Any]]:
    """A worker set's NodeSets: one, or with `serving.nodes` on the first set, its training NodeSet of the other
    nodes and a serving NodeSet (not ephemeral: the server runs until stopped) on the same node group."""
    nodeset = nodeset_values(cfg, spec)
    if not cfg.serving_on or cfg.nodes is None or spec.name != cfg.nodes.workers[0].name:
        return [nodeset]
    reserved = cfg.serving.nodes
    training = {**nodeset, "replicas": nodeset["replicas"] - reserved}
    if "initialNumberEphemeralNodes" in training:
        training["initialNumberEphemeralNodes"] = min(training["initialNumberEphemeralNodes"], training["replicas"])
    ephemeral = ("ephemeralNodes", "initialNumberEphemeralNodes", "ephemeralTopologyWaitTimeout")
    serving = {key: value for key, value in nodeset.items() if key not in ephemeral}
    return [training, {**serving, "name": serving_nodeset_name(spec.name), "replicas": reserved}]


def housekeeping_nodeset(cfg: StackConfig, system: NodeGroupSpec) -> dict[str, Any]:
    """The housekeeping NodeSet (``HOUSEKEEPING``): one slurmd of ``HOUSEKEEPING_SLURMD`` on the system nodes, which
    mount the jail and its submounts like the workers; its node line states the CPUs its pod gets."""
    fits(system, "the housekeeping slurmd, its munge and spool", HOUSEKEEPING_SLURMD, WORKER_MUNGE,
         Budget(0, 0, HOUSEKEEPING_SPOOL_GIB))
    base = nodeset_values(cfg, system)
    cpus = HOUSEKEEPING_SLURMD.cpu_m // 1000
    volumes = {**base["slurmd"]["volumes"], "spool": {"emptyDir": {"sizeLimit": f"{HOUSEKEEPING_SPOOL_GIB}Gi"}},
               "sharedMemorySize": "1Gi"}
    return {**base, "name": HOUSEKEEPING, "replicas": 1,
            "nodeConfig": {"features": ["cpu", HOUSEKEEPING], "static": f"CPUs={cpus}", "dynamic": NODE_EXTRA},
            "slurmd": {"resources": HOUSEKEEPING_SLURMD.values(), "volumes": volumes}}


def fits(spec: NodeGroupSpec, what: str, *pods: Budget) -> None:
    """``pods`` fit beside each other on one node of ``spec``, or a ValueError naming the preset."""
    budget = node_budget(spec)
    cpu, memory, disk = (sum(getattr(p, field) for p in pods) for field in ("cpu_m", "memory_gib", "ephemeral_gib"))
    if cpu > budget.cpu_m or memory > budget.memory_gib or disk > budget.ephemeral_gib:
        raise ValueError(f"nodes.{spec.role}.preset {spec.preset}: {what} need {cpu}m CPU, {memory} GiB and {disk} GiB "
                         f"of disk on one node, which offers {budget.cpu_m}m, {budget.memory_gib} GiB and "
                         f"{budget.ephemeral_gib} GiB; choose a larger preset")


def nodesets_values(cfg: StackConfig, specs: list[NodeGroupSpec]) -> dict[str, Any]:
    """The NodeSets of every worker set, then housekeeping on the system nodes; ``clusterName`` where the pinned
    chart needs it (5.0)."""
    sop = cfg.soperator
    assert sop is not None
    workers = [n for s in specs if s.role == "worker" for n in worker_nodesets(cfg, s)]
    system = _role(specs, "system")
    housekeeping = [housekeeping_nodeset(cfg, system)] if workers and system is not None else []
    values: dict[str, Any] = {"nodesets": workers + housekeeping}
    if sop.version in NODESETS_CLUSTER_NAME:
        values["clusterName"] = cfg.slurm_cluster_name
    return values


@dataclass(frozen=True)
class OperatorValues:
    """What Soperator renders a cluster's Slurm side from: the SlurmCluster's values and the NodeSets."""

    slurm_cluster: dict[str, Any]
    """helm-slurm-cluster's values (clusterName, partitionConfiguration, slurmScripts, ...)."""
    nodesets: list[dict[str, Any]]
    """helm-nodesets' ``nodesets`` (name, replicas, nodeConfig, slurmd.resources, ...)."""


def operator_values(cfg: StackConfig) -> OperatorValues:
    """A stack's SlurmCluster and NodeSet values as ``release_plan`` sends them (a stack with NodeSets). The login
    allocation id and filesystem sizes, which Slurm never sees, are placeholders here."""
    if cfg.nodes is None or cfg.filesystems is None:
        raise ValueError(f"stack target {cfg.target}: no NodeSets (nodes and filesystems are nebius stack keys)")
    plan = layout(cfg)
    sizes = {fs.mount_tag: fs.size_gib for fs in plan.filesystems}
    specs = list(plan.node_groups)
    return OperatorValues(slurm_cluster_values(cfg, specs, "", sizes), nodesets_values(cfg, specs)["nodesets"])


@dataclass(frozen=True)
class BackupTarget:
    """Where k8up writes the jail backups: the bucket name and the region's S3 endpoint."""

    bucket: Any
    endpoint: str


def k8up_values() -> dict[str, Any]:
    """k8up backs up only annotated PVCs, as soperator-fluxcd 4.1.7 installs it (templates/backup.yaml:40-44,
    ``k8up.skipWithoutAnnotation: true``; k8up chart 4.8.3 templates/deployment.yaml:41-42 makes it the operator's
    BACKUP_SKIP_WITHOUT_ANNOTATION). Of Soperator's volumes only the jail's claim carries ``k8up.io/backup``
    (helm/slurm-cluster-storage 4.1.7 templates/jail-pvc.yaml:7); the chart default false backs up every PVC."""
    return {"k8up": {"skipWithoutAnnotation": True}}


def backup_config_values(cfg: StackConfig, target: BackupTarget) -> dict[str, Any]:
    """The k8up Schedule (helm-soperator-backup-config): daily backup, prune keeping ``retentionDays``."""
    assert cfg.buckets is not None
    backups = cfg.buckets.backups
    return {
        "scheduleName": BACKUP_SCHEDULE,
        "bucket": {"name": target.bucket, "endpoint": target.endpoint},
        "secret": {"name": BACKUP_SECRET},
        "backup": {"schedule": backups.schedule},
        "prune": {"schedule": backups.prune_schedule, "retention": {"keepDaily": backups.retention_days}},
    }


def monitoring_fits(specs: list[NodeGroupSpec]) -> None:
    """The largest monitoring pod must fit one system node, or it never schedules."""
    system = _role(specs, "system")
    assert system is not None
    budget = node_budget(system)
    for pod in mon.SYSTEM_PODS:
        if pod.cpu_m > budget.cpu_m or pod.memory_mib > budget.memory_gib * 1024:
            raise ValueError(f"nodes.system.preset {system.preset}: a monitoring pod requests {pod.cpu_m}m CPU and "
                             f"{pod.memory_mib} MiB, a system node offers {budget.cpu_m}m and {budget.memory_gib} GiB; "
                             "choose a larger preset or set monitoring.enabled: false")


def monitoring_releases(cfg: StackConfig, chart: Callable[..., ReleaseSpec]) -> list[ReleaseSpec]:
    """Prometheus and VictoriaMetrics CRDs, the VictoriaMetrics stack with Grafana, Soperator's DCGM exporter and
    dashboards (``chart(key, namespace, values, **kw)`` builds a Soperator chart's release)."""
    m = cfg.monitoring
    return [
        ReleaseSpec(mon.PROMETHEUS_CRDS, mon.PROMETHEUS_CRDS, m.prometheus_crds_version, mon.NAMESPACE, {},
                    repo=mon.PROMETHEUS_REPO),
        ReleaseSpec(mon.VM_CRDS, mon.VM_CRDS, m.vm_crds_version, mon.NAMESPACE, {},
                    repo=mon.VM_REPO),
        ReleaseSpec(mon.METRICS, mon.VM_STACK_CHART, m.vm_stack_version, mon.NAMESPACE, mon.vm_stack_values(m),
                    repo=mon.VM_REPO, skip_crds=True,
                    depends_on=("cert-manager", mon.PROMETHEUS_CRDS, mon.VM_CRDS)),
        chart(mon.DCGM_EXPORTER, mon.DCGM_NAMESPACE, mon.dcgm_exporter_values(cfg), depends_on=(mon.PROMETHEUS_CRDS,)),
        chart(mon.DASHBOARDS, mon.NAMESPACE, {}, depends_on=(mon.METRICS,)),
    ]


def accounting_releases(sop: SoperatorConfig) -> list[ReleaseSpec]:
    """The MariaDB operator and its CRDs, for Slurm accounting (the operator is told its CRDs exist)."""
    repo = "https://helm.mariadb.com/mariadb-operator"
    return [
        ReleaseSpec("mariadb-operator-crds", "mariadb-operator-crds", sop.mariadb_operator_version,
                    "mariadb-operator-system", {}, repo=repo),
        ReleaseSpec("mariadb-operator", "mariadb-operator", sop.mariadb_operator_version, "mariadb-operator-system",
                    mariadb_operator_values(), repo=repo, skip_crds=True,
                    depends_on=("cert-manager", "mariadb-operator-crds")),
    ]


def release_plan(cfg: StackConfig, specs: list[NodeGroupSpec], allocation_id: Any, size_gib: dict[str, Any],
                 backup: BackupTarget | None = None) -> list[ReleaseSpec]:
    """Every release in install order, each naming the releases it waits for; active checks unless their scope
    is off; ``backup`` adds k8up and the jail backup schedule; monitoring (``cfg.monitoring_on``) comes before the operator, whose
    ServiceMonitors and PodMonitors need the Prometheus CRDs."""
    sop = cfg.soperator
    assert sop is not None and cfg.nodes is not None
    ns = cfg.slurm_namespace
    plan = [
        ReleaseSpec("cert-manager", "cert-manager", sop.cert_manager_version, "cert-manager-system",
                    cert_manager_values(), repo="https://charts.jetstack.io"),
        ReleaseSpec("kruise", "kruise", sop.kruise_version, "kruise-system", kruise_values(),
                    repo="https://openkruise.github.io/charts/"),
    ]
    operator_deps: tuple[str, ...] = ("soperator-crds", "kruise")
    if cfg.nodes.accounting is not None:
        plan += accounting_releases(sop)
        operator_deps += ("mariadb-operator",)

    def soperator(key: str, namespace: str, values: dict[str, Any], **kw: Any) -> ReleaseSpec:
        return ReleaseSpec(key, chart_ref(sop.registry, key), sop.version, namespace, values, **kw)

    if cfg.monitoring_on:
        monitoring_fits(specs)
        plan += monitoring_releases(cfg, soperator)
        operator_deps += (mon.PROMETHEUS_CRDS,)

    plan += [
        soperator("soperator-crds", SOPERATOR_NAMESPACE, {}, depends_on=("cert-manager",)),
        soperator("soperator", SOPERATOR_NAMESPACE, soperator_values(cfg), skip_crds=True, depends_on=operator_deps),
        soperator("slurm-cluster-storage", ns, storage_values(cfg, size_gib), depends_on=("soperator",)),
        soperator("slurm-cluster", ns, slurm_cluster_values(cfg, specs, allocation_id, size_gib),
                  depends_on=("slurm-cluster-storage",), deletions=SLURM_CLUSTER_DELETIONS),
        soperator("nodesets", ns, nodesets_values(cfg, specs), depends_on=("slurm-cluster",)),
    ]
    if sop.active_checks.scope != "off":
        if conflicts := active_checks.name_conflicts(cfg):
            raise ValueError("; ".join(conflicts) + "; name them as the chart does or set soperator.activeChecks.scope: off")
        plan += [
            soperator(active_checks.CONTROLLER_CHART, SOPERATOR_NAMESPACE, active_checks.controller_values(cfg),
                      depends_on=("soperator",), release_name=active_checks.CONTROLLER_RELEASE),
            soperator(active_checks.CHECKS_RELEASE, ns, active_checks.checks_values(cfg),
                      deletions=active_checks.checks_deletions(cfg),
                      depends_on=active_checks.CHECKS_READ,
                      timeout_s=active_checks.CHECKS_RELEASE_TIMEOUT_S),
        ]
    if backup is not None:
        plan += [
            ReleaseSpec("k8up", "k8up", sop.k8up_version, K8UP_NAMESPACE, k8up_values(),
                        repo="https://k8up-io.github.io/k8up"),
            soperator("soperator-backup-config", ns, backup_config_values(cfg, backup),
                      depends_on=("k8up", "slurm-cluster")),
        ]
    return plan
