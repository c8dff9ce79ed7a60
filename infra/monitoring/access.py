"""Where a nebius stack's dashboards and metrics are reached: ``kubectl port-forward`` through the cluster's API with
the stack's kubeconfig (context = cluster name), never a public endpoint. Grafana asks for the admin password, which
stays in the cluster's ``grafana-admin`` Secret and Pulumi state (a secret); the outputs carry only the command that
reads it."""

from __future__ import annotations

from documents.stack_outputs import MonitoringAccess
from infra.monitoring import releases as mon
from infra.config import StackConfig

def monitoring_access(cfg: StackConfig) -> MonitoringAccess | None:
    """The access commands of a stack with monitoring; None without."""
    if not cfg.monitoring_on:
        return None
    kubectl = f"kubectl --context {cfg.cluster_name} --namespace {mon.NAMESPACE}"
    secret = f"secret/{mon.GRAFANA_ADMIN_SECRET}"
    return MonitoringAccess(
        grafana_port_forward=f"{kubectl} port-forward service/{mon.GRAFANA_SERVICE} "
                             f"{mon.GRAFANA_LOCAL_PORT}:{mon.GRAFANA_PORT}",
        grafana_url=f"http://localhost:{mon.GRAFANA_LOCAL_PORT}",
        grafana_admin_user=mon.GRAFANA_ADMIN_USER,
        grafana_admin_password_command=f"{kubectl} get {secret} -o jsonpath='{{.data.{mon.GRAFANA_PASSWORD_KEY}}}' "
                                       "| base64 -d",
        metrics_port_forward=f"{kubectl} port-forward service/{mon.VMSINGLE_SERVICE} "
                             f"{mon.VMSINGLE_PORT}:{mon.VMSINGLE_PORT}",
        metrics_query_url=f"http://localhost:{mon.VMSINGLE_PORT}/api/v1/query",
    )
