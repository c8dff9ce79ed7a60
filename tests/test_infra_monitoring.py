"""Monitoring on cloud stacks (issue 25): the releases soperator-fluxcd 4.1.7 installs, their values against what the
charts read at their tags, their order, cost lines and access outputs, and the stack setting that removes them.

Expected values are written from the charts, not from infra/monitoring/releases.py: nebius/soperator@4.1.7
helm/soperator-fluxcd/values.yaml (observability.*), helm/soperator-dcgm-exporter (values.yaml, templates/),
helm/slurm-cluster/slurm_scripts/map_job_dcgm.sh; grafana 8.9.1 values.yaml; victoria-metrics-k8s-stack 0.39.4."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from infra.commands.cli import main
from infra.config import MonitoringConfig, StackConfig, StackConfigError, load_stack_config, parse_stack_config
from infra.cost.tco import monthly_cost
from infra.monitoring.access import monitoring_access
from infra.nebius.layout import layout
from infra.program.mocks import SECRET, run_under_mocks
from infra.soperator import helm_render
from infra.soperator.helm_render import HelmRelease
from infra.soperator.manifest_checks import custom_findings
from infra.soperator.unread_values import unread_values
from infra.soperator.values import release_plan

MONITORING = {"prometheus-operator-crds", "victoria-metrics-operator-crds", "metrics", "soperator-dcgm-exporter",
              "soperator-monitoring-dashboards"}
RELEASE = "kubernetes:helm.sh/v3:Release"
SECRET_TYPE = "kubernetes:core/v1:Secret"


def without_monitoring(cfg: StackConfig) -> StackConfig:
    return cfg.model_copy(update={"monitoring": MonitoringConfig(enabled=False)})


MIRROR = helm_render.mirror_beside(Path(__file__).resolve().parents[1])


def releases(cfg: StackConfig) -> dict:
    plan = layout(cfg)
    sizes = {fs.mount_tag: fs.size_gib for fs in plan.filesystems}
    return {r.key: r for r in release_plan(cfg, list(plan.node_groups), "alloc", sizes)}


@pytest.mark.parametrize("stack", ["dev", "demo", "h100"])
def test_cloud_stacks_install_the_reference_monitoring_at_pinned_versions(stack: str) -> None:
    got = releases(load_stack_config(stack))
    assert MONITORING <= set(got)
    pins = {key: (got[key].chart, got[key].version, got[key].namespace) for key in MONITORING}
    assert pins == {
        "prometheus-operator-crds": ("prometheus-operator-crds", "19.1.0", "monitoring-system"),
        "victoria-metrics-operator-crds": ("victoria-metrics-operator-crds", "0.0.3", "monitoring-system"),
        "metrics": ("victoria-metrics-k8s-stack", "0.39.4", "monitoring-system"),
        "soperator-dcgm-exporter": ("oci://cr.eu-north1.nebius.cloud/soperator/helm-soperator-dcgm-exporter",
                                    "4.1.7", "soperator"),
        "soperator-monitoring-dashboards": (
            "oci://cr.eu-north1.nebius.cloud/soperator/helm-soperator-monitoring-dashboards", "4.1.7",
            "monitoring-system"),
    }
    assert got["metrics"].skip_crds


def test_values_are_what_the_charts_read() -> None:
    got = releases(load_stack_config("demo"))
    dcgm = got["soperator-dcgm-exporter"].values
    # map_job_dcgm.sh writes metrics_dir="/var/run/nebius/slurm"; the exporter reads DCGM_HPC_JOB_MAPPING_DIR
    assert dcgm["dcgmHpcJobMappingDir"] == "/var/run/nebius/slurm"
    # drivers from the Nebius preset: no GPU operator, so no /run/nvidia/validations/toolkit-ready to wait for
    assert dcgm["validateToolkit"] is False
    assert dcgm["daemonSet"]["nvidiaDcgmExporter"]["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "128Mi"}}
    stack = got["metrics"].values
    assert stack["vmsingle"]["spec"]["retentionPeriod"] == "30d"
    assert stack["vmsingle"]["spec"]["storage"]["resources"]["requests"]["storage"] == "30Gi"
    assert stack["vmsingle"]["spec"]["resources"] == {"requests": {"cpu": "1000m", "memory": "2Gi"},
                                                      "limits": {"memory": "2Gi"}}
    assert stack["vmagent"]["spec"]["resources"] == {"requests": {"cpu": "5000m", "memory": "10Gi"},
                                                     "limits": {"memory": "10Gi"}}
    assert stack["alertmanager"] == {"enabled": False} and stack["vmalert"] == {"enabled": False}
    # grafana 8.9.1 values.yaml: admin.existingSecret with userKey admin-user, passwordKey admin-password
    assert stack["grafana"]["admin"] == {"existingSecret": "grafana-admin", "userKey": "admin-user",
                                         "passwordKey": "admin-password"}
    assert got["soperator-monitoring-dashboards"].values == {}
    env = got["soperator"].values["controllerManager"]["manager"]["env"]
    assert env["isPrometheusCrdInstalled"] == "true" and got["soperator"].values["serviceMonitor"] == {"enabled": True}
    cluster = got["slurm-cluster"].values
    assert cluster["slurmNodes"]["exporter"]["enabled"] is True
    assert cluster["slurmNodes"]["controller"]["openMetrics"] == {"enabled": True}
    assert cluster["sConfigController"]["serviceMonitor"]["enabled"] is True
    scripts = cluster["slurmScripts"]["builtIn"]
    assert scripts["map_job_dcgm.sh"] == scripts["unmap_job_dcgm.sh"] == {"enabled": True}


def test_gpu_operator_workers_wait_for_the_toolkit() -> None:
    cfg = load_stack_config("dev")
    assert cfg.nodes is not None
    workers = [w.model_copy(update={"gpu_drivers": "gpu-operator"}) for w in cfg.nodes.workers]
    cfg = cfg.model_copy(update={"nodes": cfg.nodes.model_copy(update={"workers": workers})})
    assert releases(cfg)["soperator-dcgm-exporter"].values["validateToolkit"] is True


def test_keys_the_reference_passes_but_the_pinned_charts_do_not_read_are_found() -> None:
    """victoria-metrics-operator 0.43.0 (the stack's subchart) has no crd.create; VMSingle's CRD prunes notAField."""
    assert MIRROR is not None, "no chart mirror: ../shared/upstream/charts or FT_CHART_MIRROR"
    got = releases(load_stack_config("demo"))
    values = copy.deepcopy(got["metrics"].values)
    values["victoria-metrics-operator"]["crd"] = {"create": False}
    values["vmsingle"]["spec"]["notAField"] = 1
    metrics = dataclasses.replace(HelmRelease.from_spec(got["metrics"]), values=values)
    asked = ["victoria-metrics-operator.crd.create", "vmsingle.spec.notAField"]
    assert unread_values(metrics, mirror=MIRROR, kube_version="1.36.0", only=asked) == asked[:1]
    crds = helm_render.render(HelmRelease.from_spec(got["victoria-metrics-operator-crds"]), mirror=MIRROR,
                              kube_version="1.36.0").objects
    (vmsingle,) = [o for o in helm_render.render(metrics, mirror=MIRROR, kube_version="1.36.0").objects
                   if o["kind"] == "VMSingle"]
    (crd,) = [c for c in crds if c["spec"]["names"]["kind"] == "VMSingle"]
    assert ("spec.notAField", "pruned: not in the CRD's schema") in custom_findings(vmsingle, crd)


def test_prometheus_crds_come_before_everything_that_creates_monitors() -> None:
    got = releases(load_stack_config("h100"))
    order = list(got)
    for key in ("metrics", "soperator-dcgm-exporter", "soperator"):
        assert "prometheus-operator-crds" in got[key].depends_on, key
    assert order.index("prometheus-operator-crds") < order.index("soperator") < order.index("slurm-cluster")
    assert "victoria-metrics-operator-crds" in got["metrics"].depends_on
    assert got["soperator-monitoring-dashboards"].depends_on == ("metrics",)


def test_the_pulumi_graph_orders_crds_secret_and_stack_and_keeps_the_password_secret() -> None:
    run = run_under_mocks(load_stack_config("demo"))
    urn = {r.name: r.urn for r in run.resources}
    stack = run.by_name("innovationbank-soperator-metrics")
    secret = run.by_name("innovationbank-soperator-grafana-admin")
    assert {urn["innovationbank-soperator-prometheus-operator-crds"], urn["innovationbank-soperator-grafana-admin"]} \
        <= set(stack.dependencies)
    assert urn["innovationbank-soperator-victoria-metrics-operator-crds"] in secret.dependencies
    assert secret.inputs["metadata"] == {"name": "grafana-admin", "namespace": "monitoring-system"}
    assert secret.inputs["stringData"] == SECRET  # the whole map, as it holds the generated password
    operator = run.by_name("innovationbank-soperator-soperator")
    assert urn["innovationbank-soperator-prometheus-operator-crds"] in operator.dependencies
    password = run.by_name("innovationbank-soperator-grafana-admin-password")
    assert password.parent == run.by_name("innovationbank-soperator").urn
    assert [k for k in run.outputs if "password" in k] == ["monitoring_grafana_admin_password_command"]
    assert run.outputs["monitoring_grafana_admin_password_command"].startswith("kubectl ")
    assert SECRET not in json.dumps({k: v for k, v in run.outputs.items() if k.startswith("monitoring_")})


def test_outputs_reach_dashboards_through_port_forward_only() -> None:
    access = monitoring_access(load_stack_config("demo"))
    assert access is not None
    out = access.flat()
    assert out["monitoring_grafana_port_forward"] == (
        "kubectl --context innovationbank --namespace monitoring-system port-forward service/metrics-grafana 3000:80")
    # the operator's Service of the stack's VMSingle, as soperator-fluxcd's vmagent remoteWrite url names it
    assert out["monitoring_metrics_port_forward"].endswith(
        "port-forward service/vmsingle-metrics-victoria-metrics-k8s-stack 8429:8429")
    assert out["monitoring_grafana_url"] == "http://localhost:3000"
    assert out["monitoring_metrics_query_url"] == "http://localhost:8429/api/v1/query"
    assert "secret/grafana-admin" in out["monitoring_grafana_admin_password_command"]
    assert all("localhost" in v for k, v in out.items() if k.endswith("_url"))
    assert monitoring_access(load_stack_config("local")) is None


def test_monitoring_adds_priced_lines_with_sources() -> None:
    cfg = load_stack_config("demo")
    on, off = monthly_cost(cfg, cfg.pricing), monthly_cost(without_monitoring(cfg), cfg.pricing)
    lines = {line.key: line for line in on.lines}
    compute, volume = lines["compute_monitoring"], lines["volume_monitoring_metrics"]
    # vmagent 5 vCPU/10 GiB + vmsingle 1 vCPU/2 GiB at cpu-d3 $0.012/vCPU-hour and $0.0032/GiB-hour, 730 h
    assert compute.usd_low == compute.usd_high == pytest.approx((6 * 0.012 + 12 * 0.0032) * 730)
    assert compute.price_keys == ("compute.cpu-d3.vcpu", "compute.cpu-d3.ram")
    assert volume.usd_low == pytest.approx(30 * 0.071) and volume.category == "volumes"
    assert on.usd_low == pytest.approx(off.usd_low + compute.usd_low + volume.usd_low)
    assert {line.key for line in off.lines} == {line.key for line in on.lines} - {compute.key, volume.key}


def test_monitoring_off_removes_releases_switches_lines_and_outputs() -> None:
    cfg = without_monitoring(load_stack_config("h100"))
    got = releases(cfg)
    assert not MONITORING & set(got)
    assert got["soperator"].values["serviceMonitor"] == {"enabled": False}
    assert got["soperator"].values["controllerManager"]["manager"]["env"]["isPrometheusCrdInstalled"] == "false"
    cluster = got["slurm-cluster"].values
    assert cluster["slurmNodes"]["exporter"]["enabled"] is False
    assert cluster["sConfigController"]["serviceMonitor"]["enabled"] is False
    assert cluster["slurmNodes"]["controller"]["openMetrics"] == {"enabled": False}
    assert set(cluster["slurmScripts"]["builtIn"]) == {"gpu_health_check.py"}
    assert "prometheus-operator-crds" not in got["soperator"].depends_on
    run = run_under_mocks(cfg)
    assert len(run.of_type(RELEASE)) == 13  # 18 with monitoring, less its 5 releases
    assert got["soperatorchecks"].values["serviceMonitor"] == {"enabled": False}
    assert [r.name for r in run.of_type(SECRET_TYPE)] == ["ft-h100-soperator-jail-backup"]
    assert not any(k.startswith("monitoring_") or "monitoring" in k for k in run.outputs)


def test_monitoring_is_a_typed_stack_setting() -> None:
    demo = load_stack_config("demo")
    assert demo.monitoring_on and demo.monitoring == MonitoringConfig()
    assert not load_stack_config("local").monitoring_on
    local = {"target": "local", "pipeline": {"runConfig": "workloads/configs/local.json"}}
    with pytest.raises(StackConfigError, match="monitoring: only a nebius stack installs monitoring"):
        parse_stack_config("local", {**local, "monitoring": {"enabled": False}}, "stacks/Pulumi.local.yaml")
    with pytest.raises(StackConfigError, match="monitoring.retentionDays"):
        parse_stack_config("local", {**local, "monitoring": {"retentionDays": 0}}, "x")


def test_a_system_node_too_small_for_vmagent_is_a_clear_error() -> None:
    cfg = load_stack_config("dev")
    assert cfg.nodes is not None
    small = cfg.nodes.system.model_copy(update={"preset": "4vcpu-16gb"})
    cfg = cfg.model_copy(update={"nodes": cfg.nodes.model_copy(update={"system": small})})
    with pytest.raises(ValueError, match="nodes.system.preset 4vcpu-16gb: a monitoring pod requests 5000m"):
        releases(cfg)
    assert "metrics" not in releases(without_monitoring(cfg))


@pytest.mark.parametrize("stack", ["demo", "h100"])
def test_offline_plan_lists_the_monitoring_releases_and_their_cost(stack: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", stack, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = {r["name"].split("-soperator-", 1)[-1] for r in doc["resources"] if r["type"] == RELEASE}
    assert MONITORING <= names
    assert "compute_monitoring" in json.dumps(doc["cost"]) and "volume_monitoring_metrics" in json.dumps(doc["cost"])
    assert doc["outputs"]["monitoring_grafana_url"] == "http://localhost:3000"
    assert main(["plan", "--stack", stack]) == 0
    text = capsys.readouterr().out
    assert "Monitoring pods on system nodes" in text and "VictoriaMetrics volume (30 GiB NETWORK_SSD)" in text
