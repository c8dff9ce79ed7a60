"""Pure values of the monitoring releases, as Soperator's reference install sets them at the pinned version.

The reference is nebius/soperator ``helm/soperator-fluxcd`` at tag 4.1.7 (``values.yaml`` ``observability`` and
``soperator.monitoringDashboards``; ``templates/prometheus-operator-crds.yaml``, ``victoria-metrics-operator-crds.yaml``,
``vm-stack.yaml``, ``dcgm-exporter.yaml``, ``monitoring-dashboards.yaml``): Prometheus operator CRDs (for the
ServiceMonitors and PodMonitors the Soperator charts and operator create), VictoriaMetrics (operator, vmagent,
vmsingle, Grafana) from ``victoria-metrics-k8s-stack`` as release ``metrics`` in ``monitoring-system``, Soperator's
DCGM exporter reading the per-job map of ``slurm_scripts/map_job_dcgm.sh`` and Soperator's Grafana dashboards.
Where this differs from the reference (Grafana login, keys its values pass that the pinned subcharts do not read)
docs/infra.md says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.config import MonitoringConfig, StackConfig

NAMESPACE = "monitoring-system"
DCGM_NAMESPACE = "soperator"
"""helm-soperator-dcgm-exporter's ServiceMonitor selects only this namespace (templates/servicemonitor.yaml)."""
PROMETHEUS_CRDS = "prometheus-operator-crds"
VM_CRDS = "victoria-metrics-operator-crds"
VM_STACK_CHART = "victoria-metrics-k8s-stack"
METRICS = "metrics"
"""Release name of the VictoriaMetrics stack (soperator-fluxcd observability.vmStack.releaseName)."""
DCGM_EXPORTER = "soperator-dcgm-exporter"
DASHBOARDS = "soperator-monitoring-dashboards"
PROMETHEUS_REPO = "https://prometheus-community.github.io/helm-charts"
VM_REPO = "https://victoriametrics.github.io/helm-charts/"
HPC_JOB_MAP_DIR = "/var/run/nebius/slurm"
"""Where map_job_dcgm.sh writes a GPU -> Slurm job file and the exporter reads it (DCGM_HPC_JOB_MAPPING_DIR)."""
DCGM_SCRIPTS = ("map_job_dcgm.sh", "unmap_job_dcgm.sh")
GRAFANA_ADMIN_SECRET = "grafana-admin"
GRAFANA_USER_KEY, GRAFANA_PASSWORD_KEY = "admin-user", "admin-password"
GRAFANA_ADMIN_USER = "admin"
GRAFANA_SERVICE, GRAFANA_PORT, GRAFANA_LOCAL_PORT = f"{METRICS}-grafana", 80, 3000
"""The grafana subchart's Service: fullname ``<release>-grafana``, service.port 80 (grafana 8.9.1 values.yaml)."""
VMSINGLE_SERVICE, VMSINGLE_PORT = f"vmsingle-{METRICS}-{VM_STACK_CHART}", 8429
"""The operator's Service of the VMSingle CR the stack names ``<release>-victoria-metrics-k8s-stack``."""
VOLUME_STORAGE_CLASS = "compute-csi-network-ssd-ext4"
VOLUME_DISK_TYPE = "NETWORK_SSD"


@dataclass(frozen=True)
class PodRequest:
    """Requests (and the equal memory limit) of one monitoring pod, from soperator-fluxcd 4.1.7 values.yaml."""

    cpu_m: int
    memory_mib: int

    def values(self) -> dict[str, Any]:
        memory = f"{self.memory_mib // 1024}Gi" if self.memory_mib % 1024 == 0 else f"{self.memory_mib}Mi"
        return {"requests": {"cpu": f"{self.cpu_m}m", "memory": memory}, "limits": {"memory": memory}}


VMAGENT = PodRequest(5000, 10 * 1024)
VMSINGLE = PodRequest(1000, 2 * 1024)
DCGM = PodRequest(100, 128)
SYSTEM_PODS = (VMAGENT, VMSINGLE)
"""Monitoring pods on the system node group (the other groups are tainted); the priced ones."""


def vm_stack_values(monitoring: MonitoringConfig) -> dict[str, Any]:
    """victoria-metrics-k8s-stack: vmagent and vmsingle sized as the reference, Grafana behind a password.

    The reference turns on anonymous Admin access and a login-less Grafana; here the admin password is a
    Pulumi secret in the ``grafana-admin`` Secret and Grafana is reached through ``kubectl port-forward`` only.
    """
    return {
        "alertmanager": {"enabled": False},
        "vmalert": {"enabled": False},
        "victoria-metrics-operator": {
            "crds": {"cleanup": {"enabled": False}},
            "operator": {"disable_prometheus_converter": False, "enable_converter_ownership": True},
        },
        "grafana": {
            "enabled": True,
            "admin": {"existingSecret": GRAFANA_ADMIN_SECRET, "userKey": GRAFANA_USER_KEY,
                      "passwordKey": GRAFANA_PASSWORD_KEY},
        },
        "kubeControllerManager": {"enabled": False},
        "kubeEtcd": {"enabled": False},
        "kubeScheduler": {"enabled": False},
        "kubeProxy": {"enabled": False},
        "coreDns": {"enabled": False},
        "vmagent": {"spec": {
            "extraArgs": {"promscrape.maxScrapeSize": "33554432", "promscrape.dropOriginalLabels": "true",
                          "promscrape.streamParse": "true"},
            "resources": VMAGENT.values(),
        }},
        "vmsingle": {"spec": {
            "retentionPeriod": f"{monitoring.retention_days}d",
            "extraArgs": {"dedup.minScrapeInterval": "30s", "maxLabelsPerTimeseries": "40",
                          "search.maxQueryLen": "18765", "search.maxUniqueTimeseries": "500000"},
            "storage": {"accessModes": ["ReadWriteOnce"], "storageClassName": VOLUME_STORAGE_CLASS,
                        "resources": {"requests": {"storage": f"{monitoring.storage_gib}Gi"}}},
            "resources": VMSINGLE.values(),
        }},
    }


def dcgm_exporter_values(cfg: StackConfig) -> dict[str, Any]:
    """The DCGM exporter on every GPU node, labelling GPU series with the Slurm job that holds the GPU.

    ``validateToolkit`` waits for the GPU operator's toolkit validation, which only exists where the GPU operator
    brings the drivers (as nebius-solutions-library sets it: the opposite of preinstalled drivers).
    """
    assert cfg.nodes is not None
    gpu_workers = [w for w in cfg.nodes.workers if w.shape.gpus]
    return {
        "dcgmHpcJobMappingDir": HPC_JOB_MAP_DIR,
        "validateToolkit": bool(gpu_workers) and all(w.gpu_drivers == "gpu-operator" for w in gpu_workers),
        "daemonSet": {"nvidiaDcgmExporter": {"resources": DCGM.values()}},
    }

