"""The whole Pulumi program for every stack, run under Pulumi mocks (preview=False)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Callable

import pytest

from infra.config import StackConfig, load_stack_config
from infra.program.mocks import MOCK_LOGIN_CIDR, SECRET, MockRun, run_under_mocks

NG = "nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup"
FS = "nebius:index/computeV1Filesystem:ComputeV1Filesystem"
GPU_CLUSTER = "nebius:index/computeV1GpuCluster:ComputeV1GpuCluster"
BUCKET = "nebius:index/storageV1Bucket:StorageV1Bucket"
RELEASE = "kubernetes:helm.sh/v3:Release"
APP = "nebius:index/applicationsV1alpha1K8sRelease:ApplicationsV1alpha1K8sRelease"
SECRET_TYPE = "kubernetes:core/v1:Secret"
PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nmock-private-key-material\n-----END OPENSSH PRIVATE KEY-----"


@pytest.fixture(scope="module")
def run_stack() -> Callable[..., MockRun]:
    """Set the mocks and the stack's config (plus a secret key), run the program. A named stack with the default
    secret runs once per module (the tests only read the run); a config object, other secrets or `fresh` run anew."""
    runs: dict[str, MockRun] = {}

    def run(stack: str | StackConfig, secrets: dict[str, str] | None = None, fresh: bool = False) -> MockRun:
        cacheable = isinstance(stack, str) and secrets is None and not fresh
        if cacheable and stack in runs:
            return runs[stack]
        cfg = load_stack_config(stack) if isinstance(stack, str) else stack
        done = run_under_mocks(cfg, {"pipelineSshPrivateKey": PRIVATE_KEY} if secrets is None else secrets)
        if cacheable:
            runs[stack] = done
        return done

    return run


def types(run: MockRun) -> Counter[str]:
    return Counter(r.type for r in run.resources)


def test_local_stack_creates_no_cloud_resources_only_the_pipeline(run_stack) -> None:
    run = run_stack("local")
    assert all(r.type.startswith(("soperator-finetune:pipeline:", "pulumi-python:dynamic:")) for r in run.resources)
    assert [r.name for r in run.resources if r.type.startswith("pulumi-python")] == [
        "local-pipeline-bundle", "local-pipeline-prepare", "local-pipeline-readiness", "local-pipeline-train",
        "local-pipeline-eval",
    ]
    assert run.outputs["target"] == "local" and run.outputs["slurm_target"] == "local"
    assert run.outputs["run_config"] == "workloads/configs/local.json"


# releases: cert-manager, kruise, soperator-crds, soperator, storage, cluster, nodesets (7); + 2 mariadb with
# accounting; + k8up and the backup schedule with backups; + 5 monitoring (Prometheus and VictoriaMetrics CRDs,
# metrics, DCGM exporter, dashboards); + 2 active checks (soperatorchecks, soperator-activechecks). apps: the
# NVIDIA network operator on a fabric.
@pytest.mark.parametrize(("stack", "groups", "filesystems", "gpu_clusters", "buckets", "releases", "apps"), [
    ("dev", 4, 5, 0, 1, 14, 0),
    ("demo", 5, 7, 0, 2, 18, 0),
    ("h100", 5, 5, 1, 2, 18, 1),
])
def test_resource_counts(run_stack, stack, groups, filesystems, gpu_clusters, buckets, releases, apps) -> None:
    counted = types(run_stack(stack))
    assert counted[NG] == groups
    assert counted[FS] == filesystems
    assert counted[GPU_CLUSTER] == gpu_clusters
    assert counted[BUCKET] == buckets
    assert counted[RELEASE] == releases
    assert counted[APP] == apps
    assert counted[SECRET_TYPE] == (1 if stack != "dev" else 0) + 1  # jail-backup with backups; grafana-admin
    assert counted["nebius:index/mk8sV1Cluster:Mk8sV1Cluster"] == 1
    assert counted["nebius:index/vpcV1Allocation:VpcV1Allocation"] == 1
    assert counted["pulumi:providers:kubernetes"] == 1


def test_parent_chains_read_like_the_architecture(run_stack) -> None:
    run = run_stack("demo")

    def chain(name: str) -> list[str]:
        names, resource = [], run.by_name(name)
        while resource.parent and any(r.urn == resource.parent for r in run.resources):
            resource = run.by_urn(resource.parent)
            names.append(resource.type.rsplit(":", 1)[-1])
        return names

    assert chain("innovationbank-worker") == ["Mk8sV1Cluster", "Mk8sCluster"]
    assert chain("innovationbank-fs-jail") == ["SharedFilesystems"]
    assert chain("innovationbank-soperator-slurm-cluster") == ["Soperator"]
    assert chain("innovationbank-buckets-backups") == ["Buckets"]
    assert chain("innovationbank-net-login-ip") == ["Network"]
    assert all(r.parent for r in run.resources if r.custom)


def test_demo_node_groups_presets_and_disks(run_stack) -> None:
    groups = {r.inputs["name"]: r.inputs for r in run_stack("demo").of_type(NG)}
    assert set(groups) == {"system", "controller", "login", "accounting", "worker"}
    worker = groups["worker"]["template"]
    assert worker["resources"] == {"platform": "gpu-l40s-d", "preset": "2gpu-64vcpu-384gb"}
    assert worker["bootDisk"] == {"type": "NETWORK_SSD_NON_REPLICATED", "sizeGibibytes": 558}
    # ephemeral workers: the GPU node group autoscales 0..size (stacks/Pulumi.demo.yaml minSize 0, size 5)
    assert groups["worker"]["autoscaling"] == {"minNodeCount": 0, "maxNodeCount": 5}
    assert "fixedNodeCount" not in groups["worker"]
    assert worker["taints"] == [{"key": "nvidia.com/gpu", "value": "2", "effect": "NO_SCHEDULE"}]
    assert "gpuCluster" not in worker
    assert groups["system"]["autoscaling"] == {"minNodeCount": 3, "maxNodeCount": 9}
    assert "fixedNodeCount" not in groups["system"]
    assert groups["login"]["template"]["bootDisk"]["sizeGibibytes"] == 256
    assert groups["controller"]["fixedNodeCount"] == 1
    assert worker["gpuSettings"] == {"driversPreset": "cuda13.0"}
    assert all("gpuSettings" not in g["template"] for name, g in groups.items() if name != "worker")
    assert groups["accounting"]["template"]["resources"]["preset"] == "8vcpu-32gb"


def test_filesystem_attachments_and_mount_tags(run_stack) -> None:
    run = run_stack("demo")
    fs_ids = {r.inputs["labels"]["soperator-finetune/mount-tag"]: f"{r.name}-id" for r in run.of_type(FS)}
    submounts = ["jail-submount-data", "jail-submount-chkpt", "jail-submount-model", "jail-submount-home"]
    expected = {
        "worker": ["jail", *submounts],
        "login": ["jail", *submounts],
        "system": ["jail", *submounts],
        "controller": ["controller-spool", "jail", *submounts, "accounting"],
        "accounting": ["jail", *submounts, "accounting"],
    }
    for group in run.of_type(NG):
        attached = group.inputs["template"]["filesystems"]
        assert [f["mountTag"] for f in attached] == expected[group.inputs["name"]]
        assert all(f["attachMode"] == "READ_WRITE" for f in attached)
        assert all(f["existingFilesystem"]["id"] == fs_ids[f["mountTag"]] for f in attached)


def test_h100_workers_join_the_infiniband_gpu_cluster(run_stack) -> None:
    run = run_stack("h100")
    (gpu_cluster,) = run.of_type(GPU_CLUSTER)
    assert gpu_cluster.inputs["infinibandFabric"] == "fabric-6"
    worker = next(r for r in run.of_type(NG) if r.inputs["name"] == "worker")
    assert worker.inputs["template"]["gpuCluster"] == {"id": f"{gpu_cluster.name}-id"}
    assert worker.inputs["template"]["resources"]["preset"] == "8gpu-128vcpu-1600gb"
    assert run.outputs["gpus_total"] == 16
    (app,) = run.of_type(APP)
    assert app.inputs["productSlug"] == "nebius/nvidia-network-operator"
    assert app.inputs["clusterId"] == "ft-h100-k8s-id"
    assert worker.urn in app.dependencies
    assert app.urn in next(r for r in run.resources if r.type.endswith(":StorageClass")).dependencies


def test_gpu_operator_instead_of_the_drivers_preset(run_stack) -> None:
    cfg = load_stack_config("demo")
    assert cfg.nodes
    worker = cfg.nodes.workers[0].model_copy(update={"gpu_drivers": "gpu-operator"})
    run = run_stack(cfg.model_copy(update={"nodes": cfg.nodes.model_copy(update={"workers": [worker]})}))
    group = next(r for r in run.of_type(NG) if r.inputs["name"] == "worker")
    assert "gpuSettings" not in group.inputs["template"]
    assert [a.inputs["productSlug"] for a in run.of_type(APP)] == ["nebius/nvidia-gpu-operator"]


def test_backup_credentials_are_secrets_and_the_schedule_reads_them(run_stack) -> None:
    run = run_stack("demo")
    secret = next(s for s in run.of_type(SECRET_TYPE) if s.inputs["metadata"]["name"] == "jail-backup")
    assert secret.inputs["metadata"] == {"name": "jail-backup", "namespace": "soperator"}  # the Slurm namespace
    assert secret.inputs["stringData"] == SECRET
    releases = {r.inputs["name"]: r for r in run.of_type(RELEASE)}
    schedule = releases["soperator-backup-config"]
    assert secret.urn in schedule.dependencies and releases["k8up"].urn in schedule.dependencies
    values = schedule.inputs["values"]
    assert values["backup"]["schedule"] == "@daily-random"
    assert values["prune"]["retention"] == {"keepDaily": 7}
    assert values["bucket"] == {"name": "innovationbank-backups", "endpoint": "https://storage.eu-north1.nebius.cloud"}
    key = run.of_type("nebius:index/iamV2AccessKey:IamV2AccessKey")[0]
    assert key.inputs["account"]["serviceAccount"]["id"] == "innovationbank-backups-sa-id"

def test_protect_flags_guard_data(run_stack) -> None:
    demo = run_stack("demo")
    for fs in demo.of_type(FS):
        assert fs.protect and fs.inputs["forbidDeletion"] is True
    assert all(b.protect for b in demo.of_type(BUCKET))
    assert not any(r.protect for r in demo.of_type(NG))
    dev = run_stack("dev")
    assert not any(fs.protect or fs.inputs["forbidDeletion"] for fs in dev.of_type(FS))
    assert [b.protect for b in dev.of_type(BUCKET)] == [False]


def test_existing_filesystem_is_reused_not_created(run_stack) -> None:
    cfg = load_stack_config("demo")
    assert cfg.filesystems
    data = cfg.filesystems.submounts[0].model_copy(update={"existing_id": "computefilesystem-e00data"})
    fs = cfg.filesystems.model_copy(update={"submounts": [data, *cfg.filesystems.submounts[1:]]})
    run = run_stack(cfg.model_copy(update={"filesystems": fs}))
    assert "innovationbank-fs-jail-submount-data" not in {r.name for r in run.of_type(FS)}
    worker = next(r for r in run.of_type(NG) if r.inputs["name"] == "worker")
    attached = {f["mountTag"]: f["existingFilesystem"]["id"] for f in worker.inputs["template"]["filesystems"]}
    assert attached["jail-submount-data"] == "computefilesystem-e00data"
    assert run.outputs["filesystem_jail_submount_data_size_gib"] == 1024


def test_helm_values_in_releases(run_stack) -> None:
    run = run_stack("demo")
    releases = {r.inputs["name"]: r for r in run.of_type(RELEASE)}
    cluster = releases["slurm-cluster"].inputs["values"]
    login = cluster["slurmNodes"]["login"]
    assert login["sshdServiceAnnotations"] == {"nebius.com/load-balancer-allocation-id": "innovationbank-net-login-ip-id"}
    assert login["sshRootPublicKeys"] == list(load_stack_config("demo").ssh_public_keys)
    assert [(m["name"], m["mountPath"]) for m in login["volumes"]["jailSubMounts"]] == [
        ("data", "/mnt/data"), ("chkpt", "/mnt/chkpt"), ("model", "/mnt/model"), ("home", "/home"),
    ]
    nodeset, _ = releases["nodesets"].inputs["values"]["nodesets"]
    assert nodeset["replicas"] == 5 and nodeset["slurmd"]["resources"]["gpu"] == 2
    storage = releases["slurm-cluster-storage"].inputs["values"]["volume"]
    assert [(s["name"], s["size"]) for s in storage["jailSubMounts"]] == [
        ("data", "1024Gi"), ("chkpt", "1024Gi"), ("model", "1024Gi"), ("home", "256Gi"),
    ]
    assert releases["soperator"].inputs["chart"] == "oci://cr.eu-north1.nebius.cloud/soperator/helm-soperator"
    assert releases["soperator"].inputs["version"] == "4.1.7" and releases["soperator"].inputs["skipCrds"] is True
    checks = releases["soperator-activechecks"].inputs
    assert checks["namespace"] == "soperator" and checks["timeout"] == 7200  # the chart hard-codes it
    assert checks["values"]["cudaVersion"] == cluster["cudaVersion"] == "13.0.2"
    assert releases["soperator-checks"].inputs["values"]["checks"]["manager"]["enableNodeReplacement"] is True


def test_active_checks_off_installs_neither_release(run_stack) -> None:
    cfg = load_stack_config("demo")
    assert cfg.soperator
    off = cfg.soperator.model_copy(update={"active_checks": cfg.soperator.active_checks.model_copy(update={"scope": "off"})})
    names = {r.inputs["name"] for r in run_stack(cfg.model_copy(update={"soperator": off})).of_type(RELEASE)}
    assert "nodesets" in names and not {"soperator-checks", "soperator-activechecks"} & names


def test_releases_wait_for_their_predecessors(run_stack) -> None:
    run = run_stack("demo")
    urn = {r.inputs["name"]: r.urn for r in run.of_type(RELEASE)}
    deps = {r.inputs["name"]: set(r.dependencies) for r in run.of_type(RELEASE)}
    assert urn["cert-manager"] in deps["soperator-crds"]
    assert {urn["soperator-crds"], urn["kruise"], urn["mariadb-operator"]} <= deps["soperator"]
    assert urn["soperator"] in deps["slurm-cluster-storage"]
    assert urn["slurm-cluster-storage"] in deps["slurm-cluster"]
    assert urn["slurm-cluster"] in deps["nodesets"]
    assert urn["soperator"] in deps["soperator-checks"]
    assert {urn[key] for key in ("slurm-cluster-storage", "slurm-cluster", "nodesets", "soperator-checks")} <= deps[
        "soperator-activechecks"]
    storage_class = next(r for r in run.resources if r.type.endswith(":StorageClass"))
    assert {r.urn for r in run.of_type(NG)} <= set(storage_class.dependencies)
    # every node group pinned to the control plane's version, as the reference pins node_group_version
    (cluster,) = run.of_type("nebius:index/mk8sV1Cluster:Mk8sV1Cluster")
    assert {r.inputs["version"] for r in run.of_type(NG)} == {cluster.inputs["controlPlane"]["version"]} == {"1.36"}


def test_outputs_are_flat_typed_and_secrets_stay_secret(run_stack) -> None:
    run = run_stack("demo")
    out = run.outputs
    assert not any(isinstance(v, dict) for v in out.values())
    lists = {k for k, v in out.items() if isinstance(v, list)}
    assert lists == {"cost_categories", "cost_lines", "cost_per_chat_scenarios", "node_groups", "filesystems", "buckets",
                     "pipeline_stages"}
    assert out["node_groups"] == ["system", "controller", "login", "accounting", "worker"]
    assert out["kubeconfig"] == SECRET and run.secret_outputs == {"kubeconfig"}
    assert out["login_address"] == MOCK_LOGIN_CIDR.split("/")[0]
    assert out["slurm_version"] == "25.11.3" and out["cluster_id"] == "innovationbank-k8s-id"
    # ephemeral workers on a node group of 0 to 5 nodes
    assert out["node_group_worker_nodes"] == 0 and out["node_group_worker_max_nodes"] == 5
    assert out["node_group_system_max_nodes"] == 9
    assert out["filesystem_jail_size_gib"] == 256 and isinstance(out["filesystem_jail_size_gib"], int)
    assert out["worker_nodes"] == 5 and out["gpus_total"] == 10
    assert out["backups_bucket_name"] == "innovationbank-backups"
    text = json.dumps(out) + json.dumps([r.inputs for r in run.resources])
    assert "mock-private-key-material" not in text
    provider = next(r for r in run.resources if r.type == "pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == SECRET


def test_programs_leave_the_pickler_as_they_found_it(run_stack) -> None:
    """pulumi wraps pickle's dict writers anew for every dynamic resource; many programs in one process
    (a test suite, the Automation API) then nest the wrappers until datasets' dill hashing overflows."""
    import pickle

    import datasets

    before = {attr: pickle._Pickler.__dict__[attr] for attr in ("_batch_setitems", "save_dict")}
    for _ in range(3):
        run = run_stack("demo", fresh=True)
        assert {"pulumi-python:dynamic:Resource"} <= set(types(run))
    assert {attr: pickle._Pickler.__dict__[attr] for attr in before} == before
    assert datasets.Dataset.from_dict({"text": ["a", "b"]})._fingerprint


def test_a_program_runs_after_asyncio_run_left_the_thread_without_a_loop(run_stack) -> None:
    """`asyncio.run` (as a serving test does, earlier in the same worker) leaves no current loop behind; the mocked
    run must bring its own rather than fail in `set_mocks` with "There is no current event loop"."""
    import asyncio

    async def nothing() -> None:
        return None

    asyncio.run(nothing())
    with pytest.raises(RuntimeError, match="no current event loop"):
        asyncio.get_event_loop_policy().get_event_loop()
    run = run_stack("local", fresh=True)
    assert run.outputs and run.resources
    run_stack("local", fresh=True)
