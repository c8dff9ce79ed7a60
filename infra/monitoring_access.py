"""Where a nebius stack's dashboards and metrics are reached: ``kubectl port-forward`` through the cluster's API with
the stack's kubeconfig (context = cluster name), never a public endpoint. Grafana asks for the admin password, which
stays in the cluster's ``grafana-admin`` Secret and Pulumi state (a secret); the outputs carry only the command that
reads it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from infra import monitoring as mon
from infra.config import StackConfig

PREFIX = "monitoring_"


class MonitoringAccess(BaseModel):
    """How to open Grafana and query VictoriaMetrics from a workstation holding the stack's kubeconfig."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grafana_port_forward: str = Field(description="Command that forwards Grafana to localhost.")
    grafana_url: str = Field(description="Grafana in a browser while the forward runs.")
    grafana_admin_user: str = Field(description="Grafana login.")
    grafana_admin_password_command: str = Field(description="Command that prints the admin password from its Secret.")
    metrics_port_forward: str = Field(description="Command that forwards VictoriaMetrics (vmsingle) to localhost.")
    metrics_query_url: str = Field(description="Prometheus-compatible query API while that forward runs.")

    def outputs(self) -> dict[str, str]:
        """Flat stack output keys, ``monitoring_<field>``."""
        return {f"{PREFIX}{key}": value for key, value in self.model_dump().items()}


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
