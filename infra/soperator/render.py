"""slurm.conf's node and partition lines as Soperator 4.1.7's operator writes them from the SlurmCluster and NodeSet
values, and the command its worker image starts slurmd with. Each rule cites nebius/soperator at tag 4.1.7; the
rehearsal cluster (scripts/local-cluster.sh) starts from these lines, so a stack whose values give a worker no node
line fails there as it fails on the cloud: that worker's slurmd finds no NodeName for its hostname and exits."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction

from documents.soperator_values import NodeSetValues, SlurmClusterValues, SoperatorValues

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"m": -1, "": 0, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_QUANTITY = re.compile(r"^\+?(\d+(?:\.\d*)?|\.\d+)(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?)$")


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes quantity as `resource.Quantity.Value()` gives it: the whole number, rounded up."""
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (e.g. 500Mi, 64Gi, 4G, 1e9)")
    number, exponent, suffix = Fraction(match[1]), match[2], match[3] or ""
    if exponent:
        number *= Fraction(10) ** int(exponent[1:])
    elif suffix in _BINARY:
        number *= 1024 ** _BINARY[suffix]
    else:
        number *= Fraction(1000) ** _DECIMAL[suffix]
    return math.ceil(number)


def real_memory_mib(nodeset: NodeSetValues) -> int:
    """RealMemory: the slurmd container's memory request in whole MiB (internal/render/common/configmap.go:758-762)."""
    try:
        return quantity_bytes(nodeset.slurmd.resources.memory) // 1_048_576
    except ValueError as error:
        raise ValueError(f"nodesets {nodeset.name}: slurmd.resources.memory {error}") from None


def node_address(pod: str, cluster_name: str, namespace: str) -> str:
    """NodeAddr: the pod's name under the NodeSets' umbrella Service (configmap.go:130-134;
    internal/naming/naming.go:68-76: `<cluster>-nodeset-svc.<namespace>.svc.cluster.local`)."""
    return f"{pod}.{cluster_name}-nodeset-svc.{namespace}.svc.cluster.local"


def pods(nodesets: Sequence[NodeSetValues]) -> list[str]:
    """Every worker pod of the NodeSets, `<nodeset>-<i>` (a StatefulSet's pod names), in the order the operator lists
    the NodeSets: by name (internal/utils/resourcegetter/nodeset.go:30-40)."""
    return [f"{n.name}-{i}" for n in sorted(nodesets, key=lambda n: n.name) for i in range(n.replicas)]


def _node_lines(cluster: SlurmClusterValues, nodesets: Sequence[NodeSetValues], namespace: str) -> list[str]:
    """configmap.go:110-181 AddNodesToSlurmConfig."""
    lines = []
    for nodeset in nodesets:
        memory = real_memory_mib(nodeset)
        for i in range(nodeset.replicas):
            pod = f"{nodeset.name}-{i}"
            # 141-148: hostname, address, memory, and the port when set (the chart always sets it: nodeset.yaml:99)
            config = (f"NodeHostname={pod} NodeAddr={node_address(pod, cluster.cluster_name, namespace)} "
                      f"RealMemory={memory} Port={nodeset.slurmd.port}")
            # 151-154: features joined by commas under the key `Feature=`
            if nodeset.node_config.features:
                config += " Feature=" + ",".join(nodeset.node_config.features)
            # 157-167: the static string split on single spaces, Feature= and State= overrides dropped
            static = " ".join(s for s in nodeset.node_config.static.split(" ")
                              if not s.startswith("Feature=") and not s.startswith("State="))
            # 169-178: appended after one space (an empty static leaves it trailing); every node static, State=CLOUD
            lines.append(f"NodeName={pod} State=CLOUD {config} {static}")
    return lines


def _partition_lines(cluster: SlurmClusterValues) -> list[str]:
    """configmap.go:188-208 AddPartitionsToSlurmConfig (a partition neither `isAll` nor with refs is skipped)."""
    lines = []
    for partition in cluster.partition_configuration.partitions:
        if partition.is_all:
            lines.append(f"PartitionName={partition.name} Nodes=ALL {partition.config}")
        elif partition.node_set_refs:
            lines.append(f"PartitionName={partition.name} Nodes={','.join(partition.node_set_refs)} {partition.config}")
    return lines


def _nodeset_lines(nodesets: Sequence[NodeSetValues]) -> list[str]:
    """configmap.go:86-103 AddNodeSetsToSlurmConfig (replicas are at least 1: the chart's default)."""
    return [f"NodeSet={n.name} Nodes={n.name}-0" if n.replicas == 1
            else f"NodeSet={n.name} Nodes={n.name}-[0-{n.replicas - 1}]" for n in nodesets]


def slurm_conf_lines(values: SoperatorValues) -> list[str]:
    """The NodeName, PartitionName and NodeSet lines of the slurm.conf the operator renders from `values`
    (configmap.go:369-386), comments left out. Its NodeSets are those of the cluster's namespace, which the
    NodeSet webhook ties to the one SlurmCluster there (internal/webhook/v1alpha1/nodeset_webhook.go:72-86), sorted
    by name (resourcegetter/nodeset.go:30-40)."""
    cluster = values.slurm_cluster
    nodesets = sorted(values.nodesets, key=lambda n: n.name)
    partitions = cluster.partition_configuration
    if partitions.config_type == "custom":
        # 370-377: only the raw lines that start with PartitionName; no node line
        return [line.strip() for line in partitions.raw_config if line.strip().startswith("PartitionName")]
    if partitions.config_type == "structured":
        # 378-381: nodes, partitions, nodesets
        return [*_node_lines(cluster, nodesets, values.namespace), *_partition_lines(cluster),
                *_nodeset_lines(nodesets)]
    # 383-385: the default partitions over ALL nodes, and no node line at all
    return ["PartitionName=main Nodes=ALL Default=YES PriorityTier=10 MaxTime=INFINITE State=UP OverSubscribe=YES",
            "PartitionName=hidden Nodes=ALL Default=NO PriorityTier=10 PreemptMode=OFF Hidden=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=YES"]


def slurmd_entrypoint_args(instance_id: str) -> list[str]:
    """The worker's slurmd arguments (images/worker/slurmd_entrypoint.sh:50-60, `--extra` left out): a static node
    (no -Z, no --conf; dynamic workers are gone), found in slurm.conf by its hostname, reporting a boot."""
    return ["-D", "--instance-id", instance_id, "-b"]
