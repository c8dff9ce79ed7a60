"""StackConfig validation and the platform catalog: every bad key is named in the error."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from planning import catalog
from infra.config import (
    PROJECT,
    StackConfigError,
    load_stack_config,
    parse_stack_config,
    read_stack_file,
    stack_file,
)

STACKS = ("local", "dev", "demo", "h100")


def demo_values() -> dict[str, Any]:
    return load_stack_config("demo").model_dump(by_alias=True, exclude={"stack"}, exclude_none=True)


def error_of(mutate: Callable[[dict[str, Any]], None]) -> str:
    values = demo_values()
    mutate(values)
    with pytest.raises(StackConfigError) as info:
        parse_stack_config("demo", values, "stacks/Pulumi.demo.yaml")
    return str(info.value)


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_file_validates(stack: str) -> None:
    cfg = load_stack_config(stack)
    assert cfg.stack == stack
    assert (cfg.target == "local") == (stack == "local")


def test_demo_is_seed_000_cluster() -> None:
    cfg = load_stack_config("demo")
    nodes, fs = cfg.nodes, cfg.filesystems
    assert nodes and fs and cfg.buckets
    (worker,) = nodes.workers
    assert (worker.size, worker.platform, worker.preset) == (5, "gpu-l40s-d", "2gpu-64vcpu-384gb")
    assert (worker.boot_disk.type, worker.boot_disk.size_gib) == ("NETWORK_SSD_NON_REPLICATED", 558)
    assert (nodes.system.min_size, nodes.system.max_size, nodes.system.preset) == (3, 9, "8vcpu-32gb")
    assert nodes.system.boot_disk.size_gib == 128
    # the seed's 2 controllers are 1: Soperator 4.1.7 runs one slurmctld (no slurmNodes.controller.size)
    assert (nodes.controller.size, nodes.controller.preset, nodes.controller.boot_disk.size_gib) == (1, "4vcpu-16gb", 128)
    assert (nodes.login.size, nodes.login.preset, nodes.login.boot_disk.size_gib) == (1, "4vcpu-16gb", 256)
    assert nodes.accounting and (nodes.accounting.preset, nodes.accounting.boot_disk.size_gib) == ("8vcpu-32gb", 128)
    assert fs.jail.size_gib == 256
    assert {(s.name, s.mount_path, s.size_gib) for s in fs.submounts} == {
        ("data", "/mnt/data", 1024), ("chkpt", "/mnt/chkpt", 1024), ("model", "/mnt/model", 1024), ("home", "/home", 256),
    }
    assert fs.accounting and fs.accounting.size_gib == 256 and fs.controller_spool.size_gib == 128
    assert cfg.buckets.backups.retention_days == 7
    # the seed's workers scale between zero and five: ephemeral nodes, node group 0..5, none powered up at creation
    assert (worker.ephemeral, worker.min_size, worker.initial_active, worker.elastic) == (True, 0, 0, True)


def test_a_node_group_below_its_size_needs_ephemeral_workers() -> None:
    """A NodeSet that is not ephemeral keeps a slurmd pod on each of its `size` nodes: the autoscaler frees none."""
    message = error_of(lambda v: v["nodes"]["workers"][0].update(ephemeral=False, initialActive=None, minSize=2))
    assert "minSize 2 below size 5 frees nodes only with ephemeral: true" in message
    fixed = demo_values()
    fixed["nodes"]["workers"][0].update(ephemeral=False, minSize=5)
    fixed["nodes"]["workers"][0].pop("initialActive")
    assert not parse_stack_config("demo", fixed, "x").nodes.workers[0].elastic


def test_h100_is_seed_001_cluster() -> None:
    cfg = load_stack_config("h100")
    assert cfg.nodes and cfg.filesystems
    (worker,) = cfg.nodes.workers
    assert (worker.size, worker.platform, worker.preset, worker.fabric) == (2, "gpu-h100-sxm", "8gpu-128vcpu-1600gb", "fabric-6")
    assert [s.mount_path for s in cfg.filesystems.submounts] == ["/mnt/training", "/mnt/inference"]


@pytest.mark.parametrize(("mutate", "key", "words"), [
    (lambda v: v["nodes"]["workers"][0].update(platform="gpu-x1"), "nodes.workers.0.platform", "unknown platform"),
    (lambda v: v["nodes"]["workers"][0].update(preset="3gpu-1vcpu-1gb"), "nodes.workers.0.preset", "not offered"),
    (lambda v: v["nodes"]["controller"].update(preset="8gpu-128vcpu-1600gb"), "nodes.controller.preset", "not offered"),
    (lambda v: v["nodes"]["workers"][0]["bootDisk"].update(sizeGib=0), "nodes.workers.0.bootDisk.sizeGib", "greater than 0"),
    (lambda v: v["nodes"]["workers"][0].update(size=-1), "nodes.workers.0.size", "greater than 0"),
    (lambda v: v["filesystems"]["jail"].update(sizeGib=0), "filesystems.jail.sizeGib", "greater than 0"),
    (lambda v: v["filesystems"]["submounts"][1].update(name="data"), "filesystems.submounts", "duplicate submount names: data"),
    (lambda v: v["filesystems"]["submounts"][1].update(mountPath="/mnt/data"), "filesystems.submounts", "duplicate submount mount paths"),
    (lambda v: v["filesystems"]["submounts"][0].update(mountPath="mnt/data"), "filesystems.submounts.0.mountPath", "must be absolute"),
    (lambda v: v["nodes"].update(workers=[]), "nodes.workers", "at least one worker set"),
    (lambda v: v.update(sshPublicKeys=[]), "sshPublicKeys", "SSH public key"),
    (lambda v: v.update(sshPublicKeys=["not a key"]), "sshPublicKeys", "not an OpenSSH public key"),
    (lambda v: v["nodes"]["workers"][0].update(fabric="fabric-6"), "nodes.workers.0.fabric", "InfiniBand"),
    (lambda v: v["nodes"]["workers"][0].update(name="login"), "nodes.workers.0.name", "reserved"),
    (lambda v: v["nodes"]["system"].update(minSize=5, maxSize=4), "nodes.system", "below minSize"),
    (lambda v: v["filesystems"]["jail"].pop("sizeGib"), "filesystems.jail", "existingId"),
    (lambda v: v.pop("nodes"), "nodes", "required on a nebius stack"),
    (lambda v: v.update(target="local"), "nebius", "local stack creates no cloud resources"),
    (lambda v: v.update(bogusKey=1), "bogusKey", "Extra inputs"),
    (lambda v: v["nebius"].pop("subnetId"), "nebius", "networkId"),
    (lambda v: v["nodes"]["workers"][0].update(ephemeral=False, initialActive=None), "nodes.workers.0", "only with ephemeral: true"),
    (lambda v: v["nodes"]["workers"][0].update(minSize=6), "nodes.workers.0", "minSize 6 is above size 5"),
    (lambda v: v["nodes"]["workers"][0].update(minSize=-1), "nodes.workers.0.minSize", "greater than or equal to 0"),
    (lambda v: v["nodes"]["workers"][0].update(initialActive=6), "nodes.workers.0", "initialActive 6 is above size 5"),
    (lambda v: v["nodes"]["workers"][0].update(topologyWaitSeconds=59), "nodes.workers.0.topologyWaitSeconds",
     "greater than or equal to 60"),
])
def test_bad_values_name_the_key(mutate: Callable[[dict[str, Any]], None], key: str, words: str) -> None:
    message = error_of(mutate)
    assert message.startswith("stacks/Pulumi.demo.yaml: invalid stack config")
    line = next(l for l in message.splitlines() if f"{PROJECT}:{key}:" in l)
    assert words in line


def test_bad_stack_file_names_file_and_key(tmp_path: Path) -> None:
    document = yaml.safe_load(Path("stacks/Pulumi.dev.yaml").read_text())
    document["config"][f"{PROJECT}:nodes"]["workers"][0]["preset"] = "9gpu-1vcpu-1gb"
    (tmp_path / "Pulumi.broken.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(StackConfigError, match=r"Pulumi.broken.yaml.*\n.*nodes\.workers\.0\.preset"):
        load_stack_config("broken", tmp_path)


def test_secure_values_are_recognised_and_plain_secrets_refused(tmp_path: Path) -> None:
    document = yaml.safe_load(Path("stacks/Pulumi.dev.yaml").read_text())
    document["config"][f"{PROJECT}:pipelineSshPrivateKey"] = {"secure": "v1:abc"}
    (tmp_path / "Pulumi.ok.yaml").write_text(yaml.safe_dump(document))
    cfg, secrets = read_stack_file("ok", tmp_path)
    assert secrets == {"pipelineSshPrivateKey"} and "abc" not in json.dumps(cfg.model_dump())
    document["config"][f"{PROJECT}:pipelineSshPrivateKey"] = "-----BEGIN OPENSSH PRIVATE KEY-----"
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(StackConfigError, match="pipelineSshPrivateKey must be a secure value"):
        read_stack_file("bad", tmp_path)


def test_missing_stack_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(StackConfigError, match=r"Pulumi.nope.yaml: no such stack file"):
        load_stack_config("nope", tmp_path)


def test_values_round_trip() -> None:
    values = demo_values()
    cfg = parse_stack_config("demo", copy.deepcopy(values), "x")
    assert cfg.model_dump(by_alias=True, exclude={"stack"}, exclude_none=True) == values


def test_catalog_shapes_come_from_preset_names() -> None:
    l40s = catalog.get_preset("gpu-l40s-d", "2gpu-64vcpu-384gb")
    assert (l40s.gpus, l40s.vcpus, l40s.ram_gib, l40s.gpu_cluster_compatible) == (2, 64, 384, False)
    assert catalog.get_preset("gpu-l40s-d", "4gpu-192vcpu-1152gb").ram_gib == 1152
    h100 = catalog.get_preset("gpu-h100-sxm", "8gpu-128vcpu-1600gb")
    assert (h100.gpus, h100.gpu_cluster_compatible) == (8, True)
    assert not catalog.get_preset("gpu-h200-sxm", "1gpu-16vcpu-200gb").gpu_cluster_compatible
    assert catalog.get_platform("gpu-h200-sxm").gpu_memory_gib == 141
    assert catalog.get_platform("gpu-l40s-a").gpu_model == "NVIDIA L40S"
    assert catalog.get_preset("cpu-d3", "8vcpu-32gb").gpus == 0
    assert not catalog.get_platform("cpu-d3").is_gpu
    with pytest.raises(catalog.CatalogError, match="unknown platform"):
        catalog.get_platform("gpu-a100")
    with pytest.raises(ValueError, match="not of the form"):
        catalog.parse_preset("big")


def test_from_pulumi_config_reads_the_runtime_config_as_pulumi_passes_it() -> None:
    import contextvars

    import pulumi
    from pulumi.runtime import config as runtime_config
    from pulumi.runtime.stack import wait_for_rpcs
    from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

    from infra.config import from_pulumi_config
    from infra.program.mocks import NebiusMocks

    values = demo_values()
    passed = {f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}
    passed |= {"nebius:domain": "api.eu.nebius.cloud:443", f"{PROJECT}:pipelineSshPrivateKey": "secret-key"}

    def read():
        runtime_config.set_all_config(passed, [f"{PROJECT}:pipelineSshPrivateKey"])
        _ensure_event_loop()
        pulumi.runtime.set_mocks(NebiusMocks(), project=PROJECT, stack="demo", preview=False)
        read_back = from_pulumi_config()
        _sync_await(wait_for_rpcs())  # the root stack's registration, finished here and not by a later run
        return read_back

    cfg = contextvars.Context().run(read)
    assert cfg == load_stack_config("demo")


def test_cloud_install_settings_are_validated() -> None:
    import pytest as _pytest

    from infra.config import StackConfigError, parse_stack_config, read_stack_file
    from infra.program.mocks import _config_values

    cfg, _ = read_stack_file("demo")
    raw = {k.split(":", 1)[1]: v for k, v in _config_values(cfg).items()}

    def with_change(path: str, mutate) -> str:
        import json
        doc = {k: json.loads(v) if k not in ("target", "clusterName") else v for k, v in raw.items()}
        mutate(doc)
        with _pytest.raises(StackConfigError) as err:
            parse_stack_config("demo", {k: v if isinstance(v, str) else json.dumps(v) for k, v in doc.items()}, "x.yaml")
        assert path in str(err.value), str(err.value)
        return str(err.value)

    with_change("nodes.controller.size", lambda d: d["nodes"]["controller"].update(size=2))
    with_change("nebius.tenantId", lambda d: d["nebius"].pop("tenantId"))
    with_change("filesystems.accounting", lambda d: d["filesystems"].pop("accounting"))
    with_change("driversPreset", lambda d: d["nodes"]["workers"][0].update(gpuDrivers="gpu-operator", driversPreset="cuda12"))
    assert cfg.nodes and cfg.nodes.workers[0].node_drivers_preset == "cuda13.0"


def _stack_variant(tmp_path, stack: str, change) -> str:
    """A copy of a shipped stack file whose project keys (namespace stripped) ``change`` edits in place."""
    document = yaml.safe_load(stack_file(stack).read_text())
    change({k.split(":", 1)[1]: v for k, v in document["config"].items()})
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(document))
    return stack


def test_kubernetes_1_31_with_cuda12_is_refused_naming_the_listed_pairs(tmp_path) -> None:
    """The reference install's table (solutions library driver_presets.tf) lists 1.35 and 1.36 with cuda13.0 only."""
    def old_pair(config):
        config["nebius"]["k8sVersion"] = "1.31"
        config["nodes"]["workers"][0]["driversPreset"] = "cuda12"
    stack = _stack_variant(tmp_path, "demo", old_pair)
    with pytest.raises(StackConfigError) as err:
        load_stack_config(stack, tmp_path)
    message = str(err.value)
    assert "nebius.k8sVersion 1.31: no preinstalled GPU images" in message
    assert "supported versions: 1.35, 1.36" in message
    assert "GPU platform(s) gpu-l40s-d have no preinstalled images for Kubernetes 1.31" in message
    assert "1.35: gpu-l40s-a cuda13.0, gpu-l40s-d cuda13.0, gpu-h100-sxm cuda13.0" in message
    assert "driver_presets.tf" in message


@pytest.mark.parametrize(("change", "expected"), [
    (lambda c: c["nodes"]["workers"][0].update(driversPreset="cuda12"),
     "nodes.workers worker: driversPreset cuda12 is not offered for gpu-l40s-d on Kubernetes 1.36 (offered: cuda13.0)"),
    (lambda c: c["nodes"]["workers"][0].update(cudaVersion="12.8.1"),
     "cudaVersion 12.8.1: Soperator 4.1.7 ships images for CUDA 12.9.0, 13.0.2 only"),
    (lambda c: c["nodes"]["workers"].append({**c["nodes"]["workers"][0], "name": "extra", "cudaVersion": "12.9.0"}),
     "all worker sets must use the same CUDA version; found 12.9.0, 13.0.2"),
    (lambda c: c["nodes"]["workers"][0].update(cudaVersion="13.0"), "nodes.workers.0.cudaVersion"),
])
def test_driver_and_cuda_preconditions_name_what_is_listed(tmp_path, change, expected) -> None:
    stack = _stack_variant(tmp_path, "demo", change)
    with pytest.raises(StackConfigError, match=re.escape(expected)):
        load_stack_config(stack, tmp_path)


def test_mixed_drivers_presets_are_refused(tmp_path, monkeypatch) -> None:
    """Two presets both offered (a table revision like the one listing 1.32) still may not mix across worker sets."""
    table = {"1.35": {"gpu-l40s-d": ("cuda12.8", "cuda13.0")}}
    monkeypatch.setattr(catalog, "SUPPORTED_DRIVER_PRESETS_BY_K8S", table)
    def two_sets(c):
        c["nodes"]["workers"].append({**c["nodes"]["workers"][0], "name": "extra", "driversPreset": "cuda12.8"})
    stack = _stack_variant(tmp_path, "demo", two_sets)
    with pytest.raises(StackConfigError, match=re.escape("all worker sets must use the same drivers preset; "
                                                         "found cuda12.8, cuda13.0")):
        load_stack_config(stack, tmp_path)


@pytest.mark.parametrize("stack", ["dev", "demo", "h100"])
def test_shipped_gpu_stacks_use_a_listed_pair_and_one_cuda_version(stack) -> None:
    cfg = load_stack_config(stack)
    assert cfg.nebius and cfg.nodes and cfg.soperator
    assert cfg.nebius.k8s_version == "1.36"  # the newest the reference lists (driver_presets.tf), as its example
    assert {w.node_drivers_preset for w in cfg.nodes.workers} == {"cuda13.0"}
    assert cfg.cuda_version == "13.0.2"
