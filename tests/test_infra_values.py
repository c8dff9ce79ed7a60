"""Pure Helm values, release order, layout and kubeconfig (no Pulumi runtime)."""

from __future__ import annotations

import base64

import pytest
import yaml

from planning import catalog
from infra.config import load_stack_config
from infra.nebius.layout import filesystem_specs, layout, node_group_specs
from infra.nebius.network import login_address
from infra.program.kubeconfig import kubeconfig
from infra.soperator.values import (
    ALLOCATION_ANNOTATION,
    SLURM_CLUSTER_DELETIONS,
    nodesets_values,
    release_plan,
    slurm_cluster_values,
    slurmd_resources,
    soperator_values,
    storage_values,
)

SIZES = {"jail": 256, "controller-spool": 128, "accounting": 256, "jail-submount-data": 1024,
         "jail-submount-chkpt": 1024, "jail-submount-model": 1024, "jail-submount-home": 256}


def specs(stack: str) -> list:
    return list(layout(load_stack_config(stack)).node_groups)


def worker(stack: str):
    return next(s for s in specs(stack) if s.role == "worker")


def test_release_order_is_a_valid_dependency_order() -> None:
    for stack in ("dev", "demo", "h100"):
        plan = release_plan(load_stack_config(stack), specs(stack), "alloc-1",
                            SIZES | {"jail-submount-training": 1, "jail-submount-inference": 1})
        seen: set[str] = set()
        for spec in plan:
            assert set(spec.depends_on) <= seen, spec.key
            seen.add(spec.key)
        keys = [s.key for s in plan]
        assert keys[-5:] == ["slurm-cluster-storage", "slurm-cluster", "nodesets", "soperatorchecks",
                             "soperator-activechecks"]
        assert ("mariadb-operator" in keys) == (stack != "dev")


def test_dev_without_accounting_tells_the_operator_no_mariadb() -> None:
    dev, demo = load_stack_config("dev"), load_stack_config("demo")
    env = lambda cfg: soperator_values(cfg)["controllerManager"]["manager"]["env"]  # noqa: E731
    assert env(dev)["isMariadbCrdInstalled"] == "false" and env(demo)["isMariadbCrdInstalled"] == "true"
    unmonitored = dev.model_copy(update={"monitoring": dev.monitoring.model_copy(update={"enabled": False})})
    assert soperator_values(unmonitored)["serviceMonitor"] == {"enabled": False}
    assert slurm_cluster_values(dev, specs("dev"), "a", SIZES)["slurmNodes"]["accounting"]["enabled"] is False


def test_slurm_cluster_values_bind_login_to_allocation_and_filter_nodes() -> None:
    cfg = load_stack_config("demo")
    values = slurm_cluster_values(cfg, specs("demo"), "vpcallocation-e00x", SIZES)
    assert values["clusterName"] == "soperator"
    assert values["slurmNodes"]["login"]["sshdServiceAnnotations"][ALLOCATION_ANNOTATION] == "vpcallocation-e00x"
    assert values["slurmNodes"]["login"]["sshdServiceType"] == "LoadBalancer"
    filters = {f["name"]: f for f in values["k8sNodeFilters"]}
    assert set(filters) == {"system", "controller", "login", "accounting", "worker"}
    expr = filters["worker"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert expr["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["worker"]
    assert filters["worker"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert {v["persistentVolumeClaim"]["claimName"] for v in values["volumeSources"]} >= {"jail-pvc", "jail-submount-home-pvc"}
    assert values["slurmScripts"]["builtIn"]["gpu_health_check.py"]["enabled"] is False
    h100 = slurm_cluster_values(load_stack_config("h100"), specs("h100"), "a", SIZES)
    assert h100["slurmScripts"]["builtIn"]["gpu_health_check.py"]["enabled"] is True


def test_nodesets_and_slurmd_resources_fit_the_preset() -> None:
    demo = load_stack_config("demo")
    res = slurmd_resources(worker("demo"))
    # 2gpu-64vcpu-384gb, 558 GiB disk: (64-1) vCPU - 0.5 daemonsets - 1 munge; floor(384*0.95) - 2 - 4 - 1 GiB;
    # floor(558*0.85) - 48 reserve - 5 munge - 64 spool emptyDir
    assert (res.gpus, res.cpu_m, res.memory_gib, res.ephemeral_gib) == (2, 61_500, 357, 357)
    ns, housekeeping = nodesets_values(demo, specs("demo"))["nodesets"]
    assert housekeeping["name"] == "housekeeping" and housekeeping["slurmd"]["resources"] == {
        "cpu": "1000m", "memory": "6Gi", "ephemeralStorage": "16Gi"}
    assert ns["slurmd"]["resources"] == {"cpu": f"{res.cpu_m}m", "memory": f"{res.memory_gib}Gi",
                                         "ephemeralStorage": f"{res.ephemeral_gib}Gi", "gpu": 2}
    assert ns["gpu"] == {"enabled": True, "nvidia": {"gdrCopyEnabled": False}}
    assert [m["mountPath"] for m in ns["slurmd"]["volumes"]["jailSubMounts"]] == ["/mnt/data", "/mnt/chkpt", "/mnt/model", "/home"]
    h100, _ = nodesets_values(load_stack_config("h100"), specs("h100"))["nodesets"]
    assert h100["gpu"]["nvidia"]["gdrCopyEnabled"] is True and h100["slurmd"]["resources"]["gpu"] == 8


def test_storage_values_use_mount_tags_as_device_names() -> None:
    values = storage_values(load_stack_config("demo"), SIZES)
    assert values["volume"]["jail"] == {"name": "jail", "size": "256Gi", "type": "filestore", "filestoreDeviceName": "jail"}
    assert values["volume"]["accounting"]["enabled"] is True
    assert {s["filestoreDeviceName"] for s in values["volume"]["jailSubMounts"]} == {
        "jail-submount-data", "jail-submount-chkpt", "jail-submount-model", "jail-submount-home"}


def test_layout_names_and_labels() -> None:
    cfg = load_stack_config("demo")
    specs = {s.name: s for s in node_group_specs(cfg)}
    assert specs["worker"].labels["nebius.com/gpu"] == "true" and "nebius.com/gpu" not in specs["login"].labels
    assert specs["controller"].taints[0].key == "slurm.nebius.ai/nodeset"
    assert [f.name for f in filesystem_specs(cfg)][:2] == ["innovationbank-jail", "innovationbank-jail-submount-data"]


def test_kubeconfig_uses_the_nebius_exec_credential() -> None:
    pem = "-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n"
    doc = yaml.safe_load(kubeconfig("c1", "pu.mk8s.example:443", pem))
    assert doc["clusters"][0]["cluster"]["server"] == "https://pu.mk8s.example:443"
    assert base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]).decode() == pem
    user = doc["users"][0]["user"]["exec"]
    assert user["command"] == "nebius" and user["args"][:4] == ["mk8s", "v1", "cluster", "get-token"]
    assert doc["current-context"] == "c1"


def test_login_address_strips_prefix() -> None:
    assert login_address("198.51.100.4/32") == "198.51.100.4"
    assert login_address(None) is None


def test_service_pods_are_sized_from_their_preset_not_chart_defaults() -> None:
    """Chart defaults ask 3 vCPU for sshd plus 0.5 for munge on a 4-vCPU login node (values.yaml:488,535)."""
    values = slurm_cluster_values(load_stack_config("demo"), specs("demo"), "a", SIZES)["slurmNodes"]
    # login cpu-d3 4vcpu-16gb, 256 GiB: (4-1) - 0.5 daemonsets - 0.5 munge; floor(16*0.95) - 2 - 4 - 1; floor(256*0.85) - 48 - 5
    assert values["login"]["sshd"]["resources"] == {"cpu": "2000m", "memory": "8Gi", "ephemeralStorage": "164Gi"}
    assert values["login"]["munge"]["resources"] == {"cpu": "500m", "memory": "1Gi", "ephemeralStorage": "5Gi"}
    # controller 4vcpu-16gb, 128 GiB: floor(128*0.85) - 48 - 5
    assert values["controller"]["slurmctld"]["resources"] == {"cpu": "2000m", "memory": "8Gi", "ephemeralStorage": "55Gi"}
    # accounting 8vcpu-32gb: 6000m / 23 GiB / 55 GiB left after munge, a third to slurmdbd, the rest to MariaDB
    acct = values["accounting"]
    assert acct["slurmdbd"]["resources"] == {"cpu": "2000m", "memory": "7Gi", "ephemeralStorage": "18Gi"}
    assert acct["mariadbOperator"]["resources"] == {"cpu": "4000m", "memory": "16Gi", "ephemeralStorage": "37Gi"}


def test_controller_spool_and_mariadb_use_the_filesystems_created_for_them() -> None:
    values = slurm_cluster_values(load_stack_config("demo"), specs("demo"), "a", SIZES)
    controller = values["slurmNodes"]["controller"]
    assert "size" not in controller
    assert controller["volumes"]["spool"] == {"volumeSourceName": "controller-spool"}
    # the chart's default volumeClaimTemplateSpec (50Gi) is deleted through value_yaml_files: NodeVolume takes one source
    assert ("slurmNodes", "controller", "volumes", "spool", "volumeClaimTemplateSpec") in SLURM_CLUSTER_DELETIONS
    assert {v["name"] for v in values["volumeSources"]} >= {"controller-spool"}
    storage = values["slurmNodes"]["accounting"]["mariadbOperator"]["storage"]
    assert storage["volumeClaimTemplate"] == {"storageClassName": "slurm-local-pv", "accessModes": ["ReadWriteMany"],
                                              "resources": {"requests": {"storage": "256Gi"}}}
    assert storage_values(load_stack_config("demo"), SIZES)["volume"]["accounting"]["size"] == "256Gi"


def test_worker_spool_is_a_bounded_volume_source() -> None:
    ns, housekeeping = nodesets_values(load_stack_config("demo"), specs("demo"))["nodesets"]
    assert ns["slurmd"]["volumes"]["spool"] == {"emptyDir": {"sizeLimit": "64Gi"}}
    assert housekeeping["slurmd"]["volumes"]["spool"] == {"emptyDir": {"sizeLimit": "8Gi"}}


def test_kruise_does_not_render_the_namespace_the_release_creates() -> None:
    plan = {r.key: r for r in release_plan(load_stack_config("demo"), specs("demo"), "a", SIZES)}
    assert plan["kruise"].values["installation"]["createNamespace"] is False


def test_nodesets_cluster_name_follows_the_pinned_version() -> None:
    cfg = load_stack_config("demo")
    assert "clusterName" not in nodesets_values(cfg, specs("demo"))
    assert cfg.soperator
    v5 = cfg.model_copy(update={"soperator": cfg.soperator.model_copy(update={"version": "5.0.0"})})
    assert nodesets_values(v5, specs("demo"))["clusterName"] == "soperator"


def test_cpu_topologies_are_the_references() -> None:
    """Entries of the solutions library's soperator/modules/available_resources/cpu_topology.tf (commit 8924ec08),
    as (boards, sockets per board, cores per socket, threads per core)."""
    reference = {
        ("gpu-h100-sxm", "8gpu-128vcpu-1600gb"): (1, 2, 32, 2), ("gpu-h200-sxm", "1gpu-16vcpu-200gb"): (1, 1, 8, 2),
        ("cpu-d3", "48vcpu-192gb"): (1, 1, 24, 2), ("cpu-e2", "48vcpu-192gb"): (1, 2, 12, 2),
        ("cpu-d3", "160vcpu-640gb"): (1, 2, 40, 2), ("cpu-e2", "4vcpu-16gb"): (1, 1, 2, 2),
    }
    for (platform, preset), layout_ in reference.items():
        topology = catalog.cpu_topology(platform, preset)
        assert (topology.boards, topology.sockets_per_board, topology.cores_per_socket,
                topology.threads_per_core, topology.kind) == (*layout_, "reference")
    l40s = catalog.cpu_topology("gpu-l40s-d", "2gpu-64vcpu-384gb")
    assert (l40s.cpus, l40s.kind) == (64, "derived")
    assert catalog.CPU_TOPOLOGIES.keys() == {(p.name, s) for p in catalog.PLATFORMS.values() for s in p.presets}
    with pytest.raises(catalog.CatalogError, match="preset '3vcpu-8gb' is not offered on cpu-d3"):
        catalog.cpu_topology("cpu-d3", "3vcpu-8gb")


def test_worker_values_follow_the_reference_install() -> None:
    """flux_release_nodesets.yaml.tftpl: static is CPUs, Boards, SocketsPerBoard, CoresPerSocket, ThreadsPerCore and
    Gres joined by spaces; enableHostUserNamespace true; slurm-scripts at /opt/slurm_scripts/ and in jail.upper."""
    ns, _ = nodesets_values(load_stack_config("h100"), specs("h100"))["nodesets"]
    assert ns["nodeConfig"]["static"] == ("CPUs=128 Boards=1 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCore=2 "
                                          "Gres=gpu:nvidia_h100_80gb_hbm3:8")
    assert ns["enableHostUserNamespace"] is True
    cfg = load_stack_config("demo")
    assert cfg.soperator
    v5 = cfg.model_copy(update={"soperator": cfg.soperator.model_copy(update={"version": "5.0.0"})})
    ns5, _ = nodesets_values(v5, specs("demo"))["nodesets"]
    names = {m["volumeSource"]["configMap"]["name"] for m in ns5["slurmd"]["volumes"]["customVolumeMounts"]
             if "configMap" in m["volumeSource"]}
    assert names == {"soperator-slurm-scripts"}  # 5.0.0 templates/_helpers.tpl:28-30: <clusterName>-slurm-scripts
