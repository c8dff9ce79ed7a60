"""Soperator 4.1.7's slurm.conf node and partition lines (infra/soperator/render.py) from the SlurmCluster and NodeSet
custom resources, checked against the operator's own tests at that tag (internal/render/common/configmap_test.go);
the resources as Helm renders them from the charts' values with their CRDs' defaults (the pinned charts in
../shared/upstream/charts, or FT_CHART_MIRROR); and the `cluster` stack's values through both."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from documents.base import DocumentError
from documents.soperator_values import OperatorResources, SoperatorValues, read_custom_resources, read_soperator_values
from infra.config import StackConfigError
from infra.soperator.helm_render import HelmRenderError, mirror_beside
from infra.soperator.rehearsal import KUBE_VERSION, cluster_stack_values, main, read_stack, rehearsal_slurmd_args
from infra.soperator.render import (
    custom_resources,
    quantity_bytes,
    real_memory_mib,
    slurm_conf_lines,
    slurmd_entrypoint_args,
    with_defaults,
)

ROOT = Path(__file__).resolve().parents[1]
MIRROR = mirror_beside(ROOT)
ADDR = "slurm-test-nodeset-svc.soperator.svc.cluster.local"


def nodeset(name: str, replicas: int, memory: str, static: str = "", features: list[str] | None = None,
            namespace: str = "soperator") -> dict:
    """A NodeSet CR as configmap_test.go builds it (no port: 0)."""
    return {"apiVersion": "slurm.nebius.ai/v1alpha1", "kind": "NodeSet",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "slurmd": {"resources": {"memory": memory}},
                     "nodeConfig": {"static": static, "features": features or []}}}


def resources(partitions: dict, *nodesets: dict) -> OperatorResources:
    cluster = {"apiVersion": "slurm.nebius.ai/v1", "kind": "SlurmCluster",
               "metadata": {"name": "slurm-test", "namespace": "soperator"},
               "spec": {"partitionConfiguration": partitions}}
    return read_custom_resources([cluster, *nodesets], "test")


STRUCTURED = {"configType": "structured", "partitions": [{"name": "main", "isAll": True}]}


def node_lines(*nodesets: dict) -> list[str]:
    return [line for line in slurm_conf_lines(resources(STRUCTURED, *nodesets)) if line.startswith("NodeName=")]


@pytest.mark.parametrize(("quantity", "mib"), [("512Mi", 512), ("1G", 953), ("1000M", 953), ("1220Gi", 1220 * 1024)])
def test_real_memory_is_the_request_in_whole_mib_as_the_operator_tests_give_it(quantity: str, mib: int) -> None:
    """Test_RenderRealMemorySlurmd (configmap_test.go:500-565), and the chart example's 1220Gi."""
    assert real_memory_mib(resources(STRUCTURED, nodeset("w", 1, quantity)).nodesets[0]) == mib


def test_quantities_round_up_to_a_whole_byte_and_bad_ones_name_the_nodeset() -> None:
    assert quantity_bytes("1.5Ki") == 1536 and quantity_bytes("1e3") == 1000 and quantity_bytes("1500m") == 2
    with pytest.raises(ValueError, match=r"NodeSet gpu: spec.slurmd.resources.memory '4 GB' is not a Kubernetes "):
        real_memory_mib(resources(STRUCTURED, nodeset("gpu", 1, "4 GB")).nodesets[0])


def test_node_lines_as_the_operator_tests_expect() -> None:
    """TestAddNodesToSlurmConfig cases 1, 3 and 4 (configmap_test.go:567-710): features joined, the static's own
    Feature= dropped, one line per replica, NodeSets by name, one of 0 replicas skipped; no port in the CR, no Port=."""
    static_a = ("Gres=gpu:nvidia-a100:4 NodeCPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCode=1 "
                "Feature=c,d")
    assert node_lines(nodeset("nodeA", 1, "2Gi", static_a, ["a", "b"])) == [
        f"NodeName=nodeA-0 State=CLOUD NodeHostname=nodeA-0 NodeAddr=nodeA-0.{ADDR} RealMemory=2048 "
        "Feature=a,b Gres=gpu:nvidia-a100:4 NodeCPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCode=1"]
    static_c = "Gres=gpu:nvidia-a100:16 NodeCPUs=256 Boards=2 SocketsPerBoard=4 CoresPerSocket=32 ThreadsPerCode=1"
    static_d = "Gres=gpu:nvidia-a100:32 NodeCPUs=512 Boards=4 SocketsPerBoard=4 CoresPerSocket=32 ThreadsPerCode=1"
    assert node_lines(nodeset("nodeD", 1, "16Gi", static_d), nodeset("nodeC", 2, "8Gi", static_c),
                      nodeset("nodeE", 0, "2Gi", static_a)) == [
        f"NodeName={pod} State=CLOUD NodeHostname={pod} NodeAddr={pod}.{ADDR} RealMemory={mib} {static}"
        for pod, mib, static in (("nodeC-0", 8192, static_c), ("nodeC-1", 8192, static_c),
                                 ("nodeD-0", 16384, static_d))]


def test_a_nodeset_without_static_gets_a_node_line_without_cpus_or_gres() -> None:
    """configmap.go:157-170: an empty static leaves only hostname, address and memory (Slurm then counts one CPU and
    no GPU: the reference always sends CPUs and Gres)."""
    assert node_lines(nodeset("gpu", 1, "1Gi")) == [
        f"NodeName=gpu-0 State=CLOUD NodeHostname=gpu-0 NodeAddr=gpu-0.{ADDR} RealMemory=1024 "]


def test_only_the_nodesets_of_the_clusters_namespace_are_its_nodes() -> None:
    """The NodeSet webhook ties a NodeSet to the SlurmCluster of its namespace (nodeset_webhook.go:72-86)."""
    assert [line.split()[0] for line in node_lines(nodeset("w", 1, "1Gi"), nodeset("x", 1, "1Gi", namespace="other"))
            ] == ["NodeName=w-0"]


def test_structured_partitions_and_nodesets_as_the_operator_tests_expect() -> None:
    """TestAddPartitionsToSlurmConfig (configmap_test.go:894-1012): isAll -> Nodes=ALL, refs joined by commas, one
    neither all nor with refs skipped; TestAddNodeSetsToSlurmConfig's NodeSet lines, 0 replicas skipped."""
    rendered = slurm_conf_lines(resources({"configType": "structured", "partitions": [
        {"name": "high-priority", "nodeSetRefs": ["nodeC"], "config": "Default=YES PriorityTier=10 State=UP"},
        {"name": "gpu", "nodeSetRefs": ["nodeA", "nodeB"], "config": "Default=NO PriorityTier=5 State=UP"},
        {"name": "all-nodes", "isAll": True, "config": "Default=NO PriorityTier=1 State=UP"},
        {"name": "invalid", "config": "Default=NO State=UP"}]},
        nodeset("nodeA", 3, "1Gi"), nodeset("nodeB", 1, "1Gi"), nodeset("nodeC", 0, "1Gi")))
    assert [line for line in rendered if not line.startswith("NodeName=")] == [
        "PartitionName=high-priority Nodes=nodeC Default=YES PriorityTier=10 State=UP",
        "PartitionName=gpu Nodes=nodeA,nodeB Default=NO PriorityTier=5 State=UP",
        "PartitionName=all-nodes Nodes=ALL Default=NO PriorityTier=1 State=UP",
        "NodeSet=nodeA Nodes=nodeA-[0-2]", "NodeSet=nodeB Nodes=nodeB-0"]


def test_the_default_config_type_writes_the_two_partitions_over_all_and_no_node() -> None:
    """configmap.go:383-385."""
    assert slurm_conf_lines(resources({"configType": "default"}, nodeset("gpu", 4, "1Gi", "CPUs=8"))) == [
        "PartitionName=main Nodes=ALL Default=YES PriorityTier=10 MaxTime=INFINITE State=UP OverSubscribe=YES",
        "PartitionName=hidden Nodes=ALL Default=NO PriorityTier=10 PreemptMode=OFF Hidden=YES MaxTime=INFINITE "
        "State=UP OverSubscribe=YES"]


def test_custom_keeps_only_partition_lines_and_structured_needs_a_partition() -> None:
    custom = resources({"configType": "custom", "rawConfig": ["  PartitionName=low Nodes=ALL Default=YES",
                                                             "NodeName=x CPUs=4"]}, nodeset("w", 1, "1Gi"))
    assert slurm_conf_lines(custom) == ["PartitionName=low Nodes=ALL Default=YES"]
    with pytest.raises(DocumentError, match="test: SlurmCluster slurm-test: spec.partitionConfiguration: Value error, "
                                            "Structured partition configuration requires at least one partition"):
        resources({"configType": "structured"}, nodeset("w", 1, "1Gi"))


def test_crd_defaults_fill_what_is_absent_inside_what_is_present() -> None:
    """The API server's structural defaulting (apiextensions-apiserver schema/defaulting/algorithm.go)."""
    schema = {"properties": {"spec": {"properties": {
        "replicas": {"default": 1}, "port": {"default": 6818}, "note": {"default": "", "nullable": True},
        "nodeConfig": {"properties": {"static": {"default": ""}}},
        "parts": {"items": {"properties": {"isAll": {"default": False}}}}}}}}
    assert with_defaults({"spec": {"port": None, "note": None, "parts": [{}, {"isAll": True}]}}, schema) == {
        "spec": {"replicas": 1, "port": 6818, "note": None, "parts": [{"isAll": False}, {"isAll": True}]}}
    assert with_defaults({}, schema) == {}


def test_slurmd_starts_as_a_static_node_and_the_rehearsal_drops_only_what_its_slurm_lacks() -> None:
    """images/worker/slurmd_entrypoint.sh:50-54 at 4.1.7."""
    assert slurmd_entrypoint_args("i-1") == ["-D", "--instance-id", "i-1", "-b"]
    assert rehearsal_slurmd_args() == ["-b"]


# --- through Helm: what the charts and the CRDs make of the values ------------------------------------------------

WORKER = {"name": "w", "slurmd": {"resources": {"cpu": "1", "memory": "1Gi"},
                                  "volumes": {"spool": {"emptyDir": {}}, "jail": {"emptyDir": {}}}},
          "munge": {"resources": {"cpu": "100m", "memory": "128Mi"}}}


def helm_resources(slurm_cluster: dict, *nodesets: dict) -> OperatorResources:
    values = SoperatorValues(namespace="soperator", slurm_cluster=slurm_cluster, nodesets=list(nodesets))
    return custom_resources(values, mirror=MIRROR, kube_version=KUBE_VERSION)


def test_the_charts_and_crds_defaults_reach_the_custom_resources() -> None:
    """helm-slurm-cluster 4.1.7: clusterName `slurm1` (values.yaml:1), configType `default` (values.yaml:23,
    slurm-cluster-cr.yaml:46); helm-nodesets: replicas `default 1` (nodeset.yaml:22, so 0 is 1 too), port
    `default 6818` (nodeset.yaml:99); the NodeSet CRD's nodeConfig.static default ``""``."""
    found = helm_resources({}, WORKER, {**WORKER, "name": "z", "replicas": 0, "nodeConfig": {"features": ["cpu"]}})
    assert (found.cluster.metadata.name, found.cluster.metadata.namespace) == ("slurm1", "soperator")
    assert found.cluster.spec.partition_configuration.config_type == "default"
    assert [(n.metadata.name, n.spec.replicas, n.spec.slurmd.port, n.spec.node_config.static)
            for n in found.nodesets] == [("w", 1, 6818, ""), ("z", 1, 6818, "")]
    assert len(slurm_conf_lines(found)) == 2, "Soperator's two default partitions, no node line"


def test_a_value_the_chart_requires_is_named() -> None:
    without_munge = {k: v for k, v in WORKER.items() if k != "munge"}
    with pytest.raises(HelmRenderError, match=r"release nodesets .*\.Values\.nodesets\[\*\]\.munge is required"):
        helm_resources({}, without_munge)


def test_the_cluster_stack_values_give_every_node_its_line_cpus_and_partition() -> None:
    cfg = read_stack(ROOT / "stacks" / "Pulumi.cluster.yaml", nodes=3, serving_nodes=1)
    stack = yaml.safe_load((ROOT / "stacks" / "Pulumi.cluster.yaml").read_text())["config"]
    cpus, memory_gib = (stack["soperator-finetune:cluster"][k] for k in ("cpusPerNode", "memoryGibPerNode"))
    lines = slurm_conf_lines(custom_resources(cluster_stack_values(cfg), mirror=MIRROR, kube_version=KUBE_VERSION))
    addr = "ftc-nodeset-svc.ftc.svc.cluster.local"
    static = f"CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1"
    assert lines == [
        f"NodeName={pod} State=CLOUD NodeHostname={pod} NodeAddr={pod}.{addr} RealMemory={memory_gib * 1024} "
        f"Port=6818 Feature=cpu {static}" for pod in ("worker-0", "worker-1", "worker-serve-0")] + [
        "PartitionName=main Nodes=worker Default=YES PriorityTier=10 MaxTime=INFINITE State=UP OverSubscribe=YES",
        "PartitionName=hidden Nodes=ALL Default=NO PriorityTier=10 PreemptMode=OFF Hidden=YES MaxTime=INFINITE "
        "State=UP OverSubscribe=YES",
        "PartitionName=serve Nodes=worker-serve Default=NO PriorityTier=10 MaxTime=INFINITE State=UP OverSubscribe=NO",
        "NodeSet=worker Nodes=worker-[0-1]", "NodeSet=worker-serve Nodes=worker-serve-0"]


def test_the_rehearsal_command_writes_its_files_and_names_bad_input(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    stack = ROOT / "stacks" / "Pulumi.cluster.yaml"
    assert main(["--stack-file", str(stack), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "pods").read_text() == (
        "worker-0 worker-0.ftc-nodeset-svc.ftc.svc.cluster.local\n"
        "worker-1 worker-1.ftc-nodeset-svc.ftc.svc.cluster.local\n")
    used = read_soperator_values(tmp_path / "out" / "values.yaml")
    assert used == cluster_stack_values(read_stack(stack, None, None))
    written = list(yaml.safe_load_all((tmp_path / "out" / "custom-resources.yaml").read_text()))
    assert [(o["kind"], o["metadata"]["name"]) for o in written] == [("SlurmCluster", "ftc"), ("NodeSet", "worker")]
    assert (tmp_path / "out" / "nodes.conf").read_text().splitlines() == slurm_conf_lines(
        read_custom_resources(written, "custom-resources.yaml"))
    assert main(["--stack-file", str(stack), "--serving-nodes", "2", "--out", str(tmp_path / "x")]) == 2
    assert "serving.nodes 2 reserves every node of the cluster (cluster.nodes 2)" in capsys.readouterr().err
    bad = tmp_path / "values.yaml"
    bad.write_text("namespace: s\nnodesets: [{name: w, slurmd: {resources: {cpu: 1, memory: 1Gi}}}]\n")
    assert main(["--stack-file", str(stack), "--values", str(bad), "--out", str(tmp_path / "y")]) == 2
    assert ".Values.nodesets[*].slurmd.volumes is required" in capsys.readouterr().err
    bad.write_text("namespace: s\nnodesets: {w: 1}\n")
    with pytest.raises(DocumentError, match=r"values.yaml: not valid Soperator values \(nodesets: Input should be a "
                                            r"valid list\)"):
        read_soperator_values(bad)
    with pytest.raises(StackConfigError, match="cannot read the stack file"):
        read_stack(tmp_path / "Pulumi.none.yaml", None, None)
