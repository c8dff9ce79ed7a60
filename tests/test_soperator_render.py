"""Soperator 4.1.7's slurm.conf node and partition lines (infra/soperator/render.py), checked against the operator's own
tests at that tag (internal/render/common/configmap_test.go), and the `cluster` stack's values through it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from documents.base import DocumentError
from documents.soperator_values import NodeSetValues, SoperatorValues, read_soperator_values
from infra.config import StackConfigError
from infra.soperator.render import quantity_bytes, real_memory_mib, slurm_conf_lines, slurmd_entrypoint_args
from infra.soperator.rehearsal import cluster_stack_values, main, read_stack, rehearsal_slurmd_args

ROOT = Path(__file__).resolve().parents[1]
ADDR = "slurm-test-nodeset-svc.soperator.svc.cluster.local"


def nodeset(name: str, replicas: int, memory: str, static: str = "", features: list[str] | None = None) -> dict:
    return {"name": name, "replicas": replicas, "slurmd": {"resources": {"memory": memory}},
            "nodeConfig": {"static": static, "features": features or []}}


def values(partitions: dict, *nodesets: dict) -> SoperatorValues:
    return SoperatorValues.model_validate({"namespace": "soperator", "nodesets": list(nodesets), "slurmCluster": {
        "clusterName": "slurm-test", "partitionConfiguration": partitions}})


def node_lines(*nodesets: dict) -> list[str]:
    rendered = slurm_conf_lines(values({"configType": "structured", "partitions": [{"name": "main", "isAll": True}]},
                                       *nodesets))
    return [line for line in rendered if line.startswith("NodeName=")]


@pytest.mark.parametrize(("quantity", "mib"), [("512Mi", 512), ("1G", 953), ("1000M", 953), ("1220Gi", 1220 * 1024)])
def test_real_memory_is_the_request_in_whole_mib_as_the_operator_tests_give_it(quantity: str, mib: int) -> None:
    """Test_RenderRealMemorySlurmd (configmap_test.go:500-565), and the chart example's 1220Gi."""
    assert real_memory_mib(NodeSetValues.model_validate(nodeset("w", 1, quantity))) == mib


def test_quantities_round_up_to_a_whole_byte_and_bad_ones_name_the_nodeset() -> None:
    assert quantity_bytes("1.5Ki") == 1536 and quantity_bytes("1e3") == 1000 and quantity_bytes("1500m") == 2
    with pytest.raises(ValueError, match=r"nodesets gpu: slurmd.resources.memory '4 GB' is not a Kubernetes quantity"):
        real_memory_mib(NodeSetValues.model_validate(nodeset("gpu", 1, "4 GB")))


def test_node_lines_as_the_operator_tests_expect_with_the_port_the_chart_always_sets() -> None:
    """TestAddNodesToSlurmConfig cases 1 and 3 (configmap_test.go:567-700): features joined, the static's own
    Feature= dropped, one line per replica. The chart always writes slurmd.port (helm/nodesets nodeset.yaml:99), so
    Port=6818 follows RealMemory (configmap.go:146-148); the Go test builds its CR without a port."""
    static_a = ("Gres=gpu:nvidia-a100:4 NodeCPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCode=1 "
                "Feature=c,d")
    assert node_lines(nodeset("nodeA", 1, "2Gi", static_a, ["a", "b"])) == [
        f"NodeName=nodeA-0 State=CLOUD NodeHostname=nodeA-0 NodeAddr=nodeA-0.{ADDR} RealMemory=2048 Port=6818 "
        "Feature=a,b Gres=gpu:nvidia-a100:4 NodeCPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCode=1"]
    static_c = "Gres=gpu:nvidia-a100:16 NodeCPUs=256 Boards=2 SocketsPerBoard=4 CoresPerSocket=32 ThreadsPerCode=1"
    static_d = "Gres=gpu:nvidia-a100:32 NodeCPUs=512 Boards=4 SocketsPerBoard=4 CoresPerSocket=32 ThreadsPerCode=1"
    assert node_lines(nodeset("nodeD", 1, "16Gi", static_d), nodeset("nodeC", 2, "8Gi", static_c)) == [
        f"NodeName={pod} State=CLOUD NodeHostname={pod} NodeAddr={pod}.{ADDR} RealMemory={mib} Port=6818 {static}"
        for pod, mib, static in (("nodeC-0", 8192, static_c), ("nodeC-1", 8192, static_c), ("nodeD-0", 16384, static_d))]


def test_a_nodeset_without_static_gets_a_node_line_without_cpus_or_gres() -> None:
    """configmap.go:157-170: an empty static leaves only hostname, address, memory and port (Slurm then counts one
    CPU and no GPU: the reference always sends CPUs and Gres)."""
    assert node_lines(nodeset("gpu", 1, "1Gi")) == [
        f"NodeName=gpu-0 State=CLOUD NodeHostname=gpu-0 NodeAddr=gpu-0.{ADDR} RealMemory=1024 Port=6818 "]


def test_zero_replicas_become_one_as_the_chart_defaults_them() -> None:
    """helm/nodesets nodeset.yaml:22 `.replicas | default 1`: Helm's default treats 0 as empty."""
    assert [line.split()[0] for line in node_lines(nodeset("w", 0, "1Gi"))] == ["NodeName=w-0"]


def test_structured_partitions_and_nodesets_as_the_operator_tests_expect() -> None:
    """TestAddPartitionsToSlurmConfig (configmap_test.go:894-1012): isAll -> Nodes=ALL, refs joined by commas, one
    neither all nor with refs skipped; TestAddNodeSetsToSlurmConfig's NodeSet lines."""
    rendered = slurm_conf_lines(values({"configType": "structured", "partitions": [
        {"name": "high-priority", "nodeSetRefs": ["nodeC"], "config": "Default=YES PriorityTier=10 State=UP"},
        {"name": "gpu", "nodeSetRefs": ["nodeA", "nodeB"], "config": "Default=NO PriorityTier=5 State=UP"},
        {"name": "all-nodes", "isAll": True, "config": "Default=NO PriorityTier=1 State=UP"},
        {"name": "invalid", "config": "Default=NO State=UP"}]}, nodeset("nodeA", 3, "1Gi"), nodeset("nodeB", 1, "1Gi")))
    assert [line for line in rendered if not line.startswith("NodeName=")] == [
        "PartitionName=high-priority Nodes=nodeC Default=YES PriorityTier=10 State=UP",
        "PartitionName=gpu Nodes=nodeA,nodeB Default=NO PriorityTier=5 State=UP",
        "PartitionName=all-nodes Nodes=ALL Default=NO PriorityTier=1 State=UP",
        "NodeSet=nodeA Nodes=nodeA-[0-2]", "NodeSet=nodeB Nodes=nodeB-0"]


def test_the_default_config_type_writes_the_two_partitions_over_all_and_no_node() -> None:
    """configmap.go:383-385, and the chart's default configType (slurm-cluster-cr.yaml:46)."""
    default = values({}, nodeset("gpu", 4, "1Gi", "CPUs=8 Gres=gpu:nvidia-h100:8"))
    assert default.slurm_cluster.partition_configuration.config_type == "default"
    assert slurm_conf_lines(default) == [
        "PartitionName=main Nodes=ALL Default=YES PriorityTier=10 MaxTime=INFINITE State=UP OverSubscribe=YES",
        "PartitionName=hidden Nodes=ALL Default=NO PriorityTier=10 PreemptMode=OFF Hidden=YES MaxTime=INFINITE "
        "State=UP OverSubscribe=YES"]


def test_custom_keeps_only_partition_lines_and_structured_needs_a_partition() -> None:
    custom = values({"configType": "custom", "rawConfig": ["  PartitionName=low Nodes=ALL Default=YES",
                                                          "NodeName=x CPUs=4"]}, nodeset("w", 1, "1Gi"))
    assert slurm_conf_lines(custom) == ["PartitionName=low Nodes=ALL Default=YES"]
    with pytest.raises(ValueError, match="Structured partition configuration requires at least one partition"):
        values({"configType": "structured"}, nodeset("w", 1, "1Gi"))


def test_slurmd_starts_as_a_static_node_and_the_rehearsal_drops_only_what_its_slurm_lacks() -> None:
    """images/worker/slurmd_entrypoint.sh:50-54 at 4.1.7."""
    assert slurmd_entrypoint_args("i-1") == ["-D", "--instance-id", "i-1", "-b"]
    assert rehearsal_slurmd_args() == ["-b"]


def test_the_cluster_stack_values_give_every_node_its_line_cpus_and_partition() -> None:
    cfg = read_stack(ROOT / "stacks" / "Pulumi.cluster.yaml", nodes=3, serving_nodes=1)
    stack = yaml.safe_load((ROOT / "stacks" / "Pulumi.cluster.yaml").read_text())["config"]
    cpus, memory_gib = (stack["soperator-finetune:cluster"][k] for k in ("cpusPerNode", "memoryGibPerNode"))
    lines = slurm_conf_lines(cluster_stack_values(cfg))
    addr = "ftc-nodeset-svc.ftc.svc.cluster.local"
    static = f"CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1"
    assert lines == [
        f"NodeName=worker-0 State=CLOUD NodeHostname=worker-0 NodeAddr=worker-0.{addr} RealMemory={memory_gib * 1024} "
        f"Port=6818 Feature=cpu {static}",
        f"NodeName=worker-1 State=CLOUD NodeHostname=worker-1 NodeAddr=worker-1.{addr} RealMemory={memory_gib * 1024} "
        f"Port=6818 Feature=cpu {static}",
        f"NodeName=worker-serve-0 State=CLOUD NodeHostname=worker-serve-0 NodeAddr=worker-serve-0.{addr} "
        f"RealMemory={memory_gib * 1024} Port=6818 Feature=cpu {static}",
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
    written = read_soperator_values(tmp_path / "out" / "values.yaml")
    assert written == cluster_stack_values(read_stack(stack, None, None))
    assert main(["--stack-file", str(stack), "--serving-nodes", "2", "--out", str(tmp_path / "x")]) == 2
    assert "serving.nodes 2 reserves every node of the cluster (cluster.nodes 2)" in capsys.readouterr().err
    bad = tmp_path / "values.yaml"
    bad.write_text("namespace: s\nslurmCluster: {}\nnodesets: [{name: w, slurmd: {resources: {}}}]\n")
    with pytest.raises(DocumentError, match=r"values.yaml: not valid Soperator values \(nodesets.0.slurmd.resources"
                                            r".memory: Field required\)"):
        read_soperator_values(bad)
    with pytest.raises(StackConfigError, match="cannot read the stack file"):
        read_stack(tmp_path / "Pulumi.none.yaml", None, None)
