"""Pure construction of the Helm releases that install Soperator, and of their values.

Key names follow the charts of the pinned Soperator release (nebius/soperator ``helm/``):
``helm-soperator``, ``helm-slurm-cluster-storage``, ``helm-slurm-cluster`` and ``helm-nodesets``.
Values may carry Pulumi inputs (ids, sizes) where they come from other resources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from infra import catalog
from infra.config import StackConfig, WorkerSet
from infra.nebius.layout import (
    ACCOUNTING,
    CONTROLLER_SPOOL,
    JAIL,
    LABEL_JAIL,
    LABEL_NODESET,
    NodeGroupSpec,
    node_group_specs,
    submount_tag,
)

ALLOCATION_ANNOTATION = "nebius.com/load-balancer-allocation-id"
SOPERATOR_NAMESPACE = "soperator-system"
STORAGE_CLASS = "compute-csi-network-ssd-ext4"
KRUISE_FEATURE_GATES = ",".join((
    "ImagePullJobGate=true", "RecreatePodWhenChangeVCTInCloneSetGate=true",
    "StatefulSetAutoResizePVCGate=true", "StatefulSetAutoDeletePVC=true",
    "PreDownloadImageForInPlaceUpdate=true", "ResourceDistributionGate=true",
))
MUNGE_CPU_M, MUNGE_MEMORY_GIB, MUNGE_EPHEMERAL_GIB = 1000, 1, 5
DAEMONSET_CPU_M, DAEMONSET_MEMORY_GIB = 500, 4
K8S_EPHEMERAL_RESERVE_GIB = 48
_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "PREFER_NO_SCHEDULE": "PreferNoSchedule", "NO_EXECUTE": "NoExecute"}


@dataclass(frozen=True)
class ReleaseSpec:
    """One Helm release: where its chart comes from, its namespace, values and predecessors."""

    key: str
    chart: str
    version: str
    namespace: str
    values: dict[str, Any] = field(hash=False)
    repo: str | None = None
    skip_crds: bool = False
    depends_on: tuple[str, ...] = ()


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
class SlurmdResources:
    cpu_m: int
    memory_gib: int
    ephemeral_gib: int
    gpus: int
    shared_memory_gib: int


def slurmd_resources(worker: WorkerSet) -> SlurmdResources:
    """What is left for slurmd on one worker after Kubernetes, munge and daemonset reserves."""
    shape = worker.shape
    allocatable_cpu_m = (shape.vcpus - 1) * 1000
    allocatable_mem = math.floor(shape.ram_gib * 0.95) - 2
    allocatable_disk = math.floor(worker.boot_disk.size_gib * 0.85) - K8S_EPHEMERAL_RESERVE_GIB
    return SlurmdResources(
        cpu_m=allocatable_cpu_m - MUNGE_CPU_M - DAEMONSET_CPU_M,
        memory_gib=allocatable_mem - MUNGE_MEMORY_GIB - DAEMONSET_MEMORY_GIB,
        ephemeral_gib=allocatable_disk - MUNGE_EPHEMERAL_GIB,
        gpus=shape.gpus,
        shared_memory_gib=max(1, shape.ram_gib // 4),
    )


def _match(key: str, values: list[str]) -> list[dict[str, Any]]:
    return [{"key": key, "operator": "In", "values": values}]


def cert_manager_values() -> dict[str, Any]:
    return {"crds": {"enabled": True}}


def kruise_values() -> dict[str, Any]:
    return {"featureGates": KRUISE_FEATURE_GATES, "crds": {"managed": True}}


def mariadb_operator_values() -> dict[str, Any]:
    return {"webhook": {"cert": {"certManager": {"enabled": True}}}, "metrics": {"enabled": False}}


def soperator_values(cfg: StackConfig) -> dict[str, Any]:
    """The operator: cert-manager webhooks, Kruise installed separately, no Prometheus CRDs."""
    accounting = bool(cfg.nodes and cfg.nodes.accounting)
    return {
        "certManager": {"enabled": True},
        "kruise": {"installOperator": False},
        "serviceMonitor": {"enabled": False},
        "controllerManager": {"manager": {"env": {
            "isMariadbCrdInstalled": "true" if accounting else "false",
            "isPrometheusCrdInstalled": "false",
        }}},
    }


def storage_values(cfg: StackConfig, size_gib: dict[str, Any]) -> dict[str, Any]:
    """Filestores as local PVs/PVCs; ``size_gib`` maps mount tag to size."""
    fs = cfg.filesystems
    assert fs is not None
    everywhere = [{"operator": "Exists"}]
    accounting_groups = ["controller", "accounting"] if cfg.nodes and cfg.nodes.accounting else ["controller"]
    return {
        "volume": {
            "jail": {"name": JAIL, "size": gib(size_gib[JAIL]), "type": "filestore", "filestoreDeviceName": JAIL},
            "controllerSpool": {
                "name": CONTROLLER_SPOOL, "size": gib(size_gib[CONTROLLER_SPOOL]),
                "filestoreDeviceName": CONTROLLER_SPOOL,
            },
            "accounting": {
                "enabled": fs.accounting is not None, "name": ACCOUNTING,
                "size": gib(size_gib.get(ACCOUNTING, 1)), "filestoreDeviceName": ACCOUNTING,
            },
            "jailSubMounts": [
                {"name": s.name, "size": gib(size_gib[submount_tag(s.name)]), "filestoreDeviceName": submount_tag(s.name)}
                for s in fs.submounts
            ],
        },
        "storage": {
            "jail": {"matchExpressions": _match(LABEL_JAIL, ["true"]), "tolerations": everywhere},
            "controllerSpool": {"matchExpressions": _match(LABEL_NODESET, ["controller"]), "tolerations": everywhere},
            "accounting": {"matchExpressions": _match(LABEL_NODESET, accounting_groups), "tolerations": everywhere},
        },
    }


def _pvc_source(name: str, claim: str) -> dict[str, Any]:
    return {
        "name": name, "createPVC": False, "storageClassName": "", "size": "",
        "persistentVolumeClaim": {"claimName": claim, "readOnly": False},
    }


def _hopper_only(cfg: StackConfig) -> bool:
    assert cfg.nodes is not None
    return all(w.shape.gpu_cluster_compatible for w in cfg.nodes.workers)


def slurm_cluster_values(cfg: StackConfig, allocation_id: Any) -> dict[str, Any]:
    """The SlurmCluster CR: node filters, jail and submounts, controller, login, accounting."""
    nodes, fs = cfg.nodes, cfg.filesystems
    assert nodes is not None and fs is not None
    specs = node_group_specs(cfg)
    first_worker = nodes.workers[0].name
    return {
        "clusterName": cfg.cluster_name,
        "k8sNodeFilters": [node_filter(s) for s in specs],
        "volumeSources": [
            _pvc_source(CONTROLLER_SPOOL, f"{CONTROLLER_SPOOL}-pvc"),
            _pvc_source(JAIL, f"{JAIL}-pvc"),
            *(_pvc_source(submount_tag(s.name), f"{submount_tag(s.name)}-pvc") for s in fs.submounts),
        ],
        "populateJail": {"k8sNodeFilterName": first_worker},
        "slurmNodes": {
            "accounting": {
                "enabled": nodes.accounting is not None,
                "k8sNodeFilterName": "accounting" if nodes.accounting else "controller",
                "mariadbOperator": {"enabled": nodes.accounting is not None, "metrics": {"enabled": False}},
            },
            "controller": {
                "size": nodes.controller.size,
                "k8sNodeFilterName": "controller",
                "openMetrics": {"enabled": False},
            },
            "login": {
                "size": nodes.login.size,
                "k8sNodeFilterName": "login",
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
            "exporter": {"enabled": False, "k8sNodeFilterName": "system"},
        },
        "sConfigController": {"node": {"k8sNodeFilterName": "system"}, "serviceMonitor": {"enabled": False}},
        "slurmScripts": {"builtIn": {"gpu_health_check.py": {"enabled": _hopper_only(cfg)}}},
    }


def nodeset_values(cfg: StackConfig, worker: WorkerSet) -> dict[str, Any]:
    """One NodeSet CR: replicas, GPUs, slurmd resources, jail and submounts, placement."""
    fs = cfg.filesystems
    assert fs is not None
    res = slurmd_resources(worker)
    name = worker.name
    gpu = res.gpus > 0
    spec = next(s for s in node_group_specs(cfg) if s.name == name)
    slurmd_res: dict[str, Any] = {
        "cpu": f"{res.cpu_m}m", "memory": f"{res.memory_gib}Gi", "ephemeralStorage": f"{res.ephemeral_gib}Gi",
    }
    if gpu:
        slurmd_res["gpu"] = res.gpus
    filt = node_filter(spec)
    return {
        "name": name,
        "replicas": worker.size,
        "maxUnavailable": 1,
        "gpu": {"enabled": gpu, "nvidia": {"gdrCopyEnabled": worker.fabric is not None}} if gpu else {"enabled": False},
        "nodeConfig": {
            "features": ["gpu", catalog.get_platform(worker.platform).name] if gpu else ["cpu"],
            "dynamic": "InstanceId={{ .PodName }}",
            **({"gresConfig": ["AutoDetect=nvidia"]} if gpu else {}),
        },
        "slurmd": {
            "resources": slurmd_res,
            "volumes": {
                "spool": {"volumeClaimTemplateSpec": {
                    "storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "128Gi"}},
                }},
                "jail": {"persistentVolumeClaim": {"claimName": f"{JAIL}-pvc"}},
                "jailSubMounts": [
                    {"name": s.name, "mountPath": s.mount_path, "readOnly": False,
                     "volumeSource": {"persistentVolumeClaim": {"claimName": f"{submount_tag(s.name)}-pvc"}}}
                    for s in fs.submounts
                ],
                "sharedMemorySize": f"{res.shared_memory_gib}Gi",
            },
        },
        "munge": {"resources": {
            "cpu": f"{MUNGE_CPU_M}m", "memory": f"{MUNGE_MEMORY_GIB}Gi", "ephemeralStorage": f"{MUNGE_EPHEMERAL_GIB}Gi",
        }},
        "priorityClass": "soperator-worker-high-priority",
        "affinity": filt["affinity"],
        "tolerations": filt["tolerations"],
    }


def nodesets_values(cfg: StackConfig) -> dict[str, Any]:
    assert cfg.nodes is not None
    return {"nodesets": [nodeset_values(cfg, w) for w in cfg.nodes.workers]}


def release_plan(cfg: StackConfig, allocation_id: Any, size_gib: dict[str, Any]) -> list[ReleaseSpec]:
    """Every release in install order, each naming the releases it waits for."""
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
        plan += [
            ReleaseSpec("mariadb-operator-crds", "mariadb-operator-crds", sop.mariadb_operator_version,
                        "mariadb-operator-system", {}, repo="https://helm.mariadb.com/mariadb-operator"),
            ReleaseSpec("mariadb-operator", "mariadb-operator", sop.mariadb_operator_version,
                        "mariadb-operator-system", mariadb_operator_values(),
                        repo="https://helm.mariadb.com/mariadb-operator", skip_crds=True,
                        depends_on=("cert-manager", "mariadb-operator-crds")),
        ]
        operator_deps += ("mariadb-operator",)
    plan += [
        ReleaseSpec("soperator-crds", chart_ref(sop.registry, "soperator-crds"), sop.version,
                    SOPERATOR_NAMESPACE, {}, depends_on=("cert-manager",)),
        ReleaseSpec("soperator", chart_ref(sop.registry, "soperator"), sop.version, SOPERATOR_NAMESPACE,
                    soperator_values(cfg), skip_crds=True, depends_on=operator_deps),
        ReleaseSpec("slurm-cluster-storage", chart_ref(sop.registry, "slurm-cluster-storage"), sop.version, ns,
                    storage_values(cfg, size_gib), depends_on=("soperator",)),
        ReleaseSpec("slurm-cluster", chart_ref(sop.registry, "slurm-cluster"), sop.version, ns,
                    slurm_cluster_values(cfg, allocation_id), depends_on=("slurm-cluster-storage",)),
        ReleaseSpec("nodesets", chart_ref(sop.registry, "nodesets"), sop.version, ns,
                    nodesets_values(cfg), depends_on=("slurm-cluster",)),
    ]
    return plan
