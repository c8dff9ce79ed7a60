"""Pure Helm values, release order, layout and kubeconfig (no Pulumi runtime)."""

from __future__ import annotations

import base64

import yaml

from infra.config import load_stack_config
from infra.kubeconfig import kubeconfig
from infra.nebius.layout import filesystem_specs, node_group_specs
from infra.nebius.network import login_address
from infra.soperator_values import (
    ALLOCATION_ANNOTATION,
    nodesets_values,
    release_plan,
    slurm_cluster_values,
    slurmd_resources,
    soperator_values,
    storage_values,
)

SIZES = {"jail": 256, "controller-spool": 128, "accounting": 256, "jail-submount-data": 1024,
         "jail-submount-chkpt": 1024, "jail-submount-model": 1024, "jail-submount-home": 256}


def test_release_order_is_a_valid_dependency_order() -> None:
    for stack in ("dev", "demo", "h100"):
        plan = release_plan(load_stack_config(stack), "alloc-1", SIZES | {"jail-submount-training": 1, "jail-submount-inference": 1})
        seen: set[str] = set()
        for spec in plan:
            assert set(spec.depends_on) <= seen, spec.key
            seen.add(spec.key)
        keys = [s.key for s in plan]
        assert keys[-3:] == ["slurm-cluster-storage", "slurm-cluster", "nodesets"]
        assert ("mariadb-operator" in keys) == (stack != "dev")


def test_dev_without_accounting_tells_the_operator_no_mariadb() -> None:
    dev, demo = load_stack_config("dev"), load_stack_config("demo")
    env = lambda cfg: soperator_values(cfg)["controllerManager"]["manager"]["env"]  # noqa: E731
    assert env(dev)["isMariadbCrdInstalled"] == "false" and env(demo)["isMariadbCrdInstalled"] == "true"
    assert soperator_values(dev)["serviceMonitor"] == {"enabled": False}
    assert slurm_cluster_values(dev, "a")["slurmNodes"]["accounting"]["enabled"] is False


def test_slurm_cluster_values_bind_login_to_allocation_and_filter_nodes() -> None:
    cfg = load_stack_config("demo")
    values = slurm_cluster_values(cfg, "vpcallocation-e00x")
    assert values["clusterName"] == "innovationbank"
    assert values["slurmNodes"]["login"]["sshdServiceAnnotations"][ALLOCATION_ANNOTATION] == "vpcallocation-e00x"
    assert values["slurmNodes"]["login"]["sshdServiceType"] == "LoadBalancer"
    filters = {f["name"]: f for f in values["k8sNodeFilters"]}
    assert set(filters) == {"system", "controller", "login", "accounting", "worker"}
    expr = filters["worker"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert expr["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["worker"]
    assert filters["worker"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert {v["persistentVolumeClaim"]["claimName"] for v in values["volumeSources"]} >= {"jail-pvc", "jail-submount-home-pvc"}
    assert values["slurmScripts"]["builtIn"]["gpu_health_check.py"]["enabled"] is False
    h100 = slurm_cluster_values(load_stack_config("h100"), "a")
    assert h100["slurmScripts"]["builtIn"]["gpu_health_check.py"]["enabled"] is True


def test_nodesets_and_slurmd_resources_fit_the_preset() -> None:
    demo = load_stack_config("demo")
    assert demo.nodes
    res = slurmd_resources(demo.nodes.workers[0])
    assert res.gpus == 2 and 0 < res.cpu_m < 64_000 and 0 < res.memory_gib < 384 and 0 < res.ephemeral_gib < 558
    (ns,) = nodesets_values(demo)["nodesets"]
    assert ns["slurmd"]["resources"] == {"cpu": f"{res.cpu_m}m", "memory": f"{res.memory_gib}Gi",
                                         "ephemeralStorage": f"{res.ephemeral_gib}Gi", "gpu": 2}
    assert ns["gpu"] == {"enabled": True, "nvidia": {"gdrCopyEnabled": False}}
    assert [m["mountPath"] for m in ns["slurmd"]["volumes"]["jailSubMounts"]] == ["/mnt/data", "/mnt/chkpt", "/mnt/model", "/home"]
    (h100,) = nodesets_values(load_stack_config("h100"))["nodesets"]
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
