"""The rehearsal cluster's Slurm nodes from Soperator values (scripts/local-cluster.sh runs this module).

A `cluster` stack (an existing Slurm, no Soperator) is described by the SlurmCluster and NodeSet values a Soperator
install of the same nodes would get, as the nebius stacks send them (infra/soperator/values.py): structured
partitions, the training partition over the workers' NodeSet, Soperator's hidden one over all, the serving one over
the serving NodeSet, and each NodeSet's `nodeConfig.static` with its CPUs (and Gres). The rehearsal writes slurm.conf's
node and partition lines from them with infra/soperator/render.py, and names and addresses its nodes as the pods.

    python -m infra.soperator.rehearsal --stack-file stacks/Pulumi.cluster.yaml [--nodes N] [--serving-nodes K]
                                        [--values FILE] --out DIR

writes DIR/values.yaml (the values used; --values FILE instead of the stack's), DIR/nodes.conf (the lines),
DIR/pods (`<pod> <address>` per worker pod) and DIR/slurmd.args (how slurmd starts).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from documents.atomic import atomic_file
from documents.base import DocumentError
from documents.soperator_values import (
    NodeConfig,
    NodeSetValues,
    Partition,
    PartitionConfiguration,
    SlurmClusterValues,
    SlurmdResourcesValues,
    SlurmdValues,
    SoperatorValues,
    read_soperator_values,
    write_soperator_values,
)
from infra.config import (
    PROJECT,
    SERVING_HIDDEN,
    StackConfig,
    StackConfigError,
    parse_stack_config,
    serving_nodeset_name,
    split_namespace,
)
from infra.soperator.render import node_address, pods, slurm_conf_lines, slurmd_entrypoint_args
from infra.soperator.values import HIDDEN_PARTITION_CONFIG, MAIN_PARTITION_CONFIG, SERVING_PARTITION_CONFIG

WORKER_NODESET = "worker"
"""The NodeSet of a `cluster` stack's workers (its pods, and Slurm nodes, are worker-0, worker-1, ...)."""


def node_static(cpus: int, gpus: int) -> str:
    """`nodeConfig.static` of a node with `cpus` single-threaded cores on one socket, and its GPUs (untyped Gres:
    an existing cluster's stack does not name the GPU model)."""
    topology = f"CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1"
    return f"{topology} Gres=gpu:{gpus}" if gpus else topology


def cluster_stack_values(cfg: StackConfig) -> SoperatorValues:
    """The Soperator values equivalent to a `cluster` stack's nodes (cluster.nodes, cpusPerNode, gpusPerNode,
    memoryGibPerNode; serving.nodes of them in a serving NodeSet)."""
    cluster = cfg.cluster
    if cluster is None:
        raise StackConfigError(f"stack {cfg.stack}: target {cfg.target} has no cluster section; only a cluster "
                               "stack describes its nodes this way")
    gpus = cluster.gpus_per_node
    node = {"node_config": NodeConfig(features=["gpu"] if gpus else ["cpu"],
                                      static=node_static(cluster.cpus_per_node, gpus)),
            "slurmd": SlurmdValues(resources=SlurmdResourcesValues(memory=f"{cluster.memory_gib_per_node}Gi"))}
    serving = cfg.serving.nodes
    nodesets = [NodeSetValues(name=WORKER_NODESET, replicas=cluster.nodes - serving, **node)]
    partitions = [Partition(name=cfg.serving.training_partition, node_set_refs=[WORKER_NODESET],
                            config=MAIN_PARTITION_CONFIG),
                  Partition(name=SERVING_HIDDEN, is_all=True, config=HIDDEN_PARTITION_CONFIG)]
    if serving:
        name = serving_nodeset_name(WORKER_NODESET)
        nodesets.append(NodeSetValues(name=name, replicas=serving, **node))
        partitions.append(Partition(name=cfg.serving.partition, node_set_refs=[name], config=SERVING_PARTITION_CONFIG))
    return SoperatorValues(
        namespace=cfg.slurm_namespace,
        slurm_cluster=SlurmClusterValues(cluster_name=cfg.slurm_cluster_name, partition_configuration=
                                         PartitionConfiguration(config_type="structured", partitions=partitions)),
        nodesets=nodesets)


def rehearsal_slurmd_args() -> list[str]:
    """The worker image's slurmd arguments as the rehearsal runs them: no -D (no supervisor here; slurmd forks) and
    no --instance-id (Slurm 22.05 on this machine has no such option; it records the cloud instance, the node is
    still found by its hostname)."""
    args = slurmd_entrypoint_args("-")
    at = args.index("--instance-id")
    return [a for i, a in enumerate(args) if a != "-D" and i not in (at, at + 1)]


def read_stack(path: Path, nodes: int | None, serving_nodes: int | None) -> StackConfig:
    """The stack file `Pulumi.<stack>.yaml` at `path`, with cluster.nodes and serving.nodes replaced where given."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise StackConfigError(f"{path}: cannot read the stack file: {error}") from None
    config = dict(document.get("config") or {}) if isinstance(document, dict) else {}
    if nodes is not None:
        config[f"{PROJECT}:cluster"] = {**(config.get(f"{PROJECT}:cluster") or {}), "nodes": nodes}
    if serving_nodes is not None:
        config[f"{PROJECT}:serving"] = {**(config.get(f"{PROJECT}:serving") or {}), "nodes": serving_nodes}
    values, _ = split_namespace(config, str(path))
    stack = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    return parse_stack_config(stack, values, str(path))


def write_rehearsal(values: SoperatorValues, out: Path) -> None:
    write_soperator_values(out / "values.yaml", values)
    for name, lines in (("nodes.conf", slurm_conf_lines(values)),
                        ("pods", [f"{p} {node_address(p, values.slurm_cluster.cluster_name, values.namespace)}"
                                  for p in pods(values.nodesets)]),
                        ("slurmd.args", rehearsal_slurmd_args())):
        with atomic_file(out / name) as tmp:
            tmp.write_text("".join(f"{line}\n" for line in lines))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.soperator.rehearsal", description=__doc__.splitlines()[0])
    parser.add_argument("--stack-file", type=Path, required=True)
    parser.add_argument("--nodes", type=int, help="cluster.nodes instead of the stack's")
    parser.add_argument("--serving-nodes", type=int, help="serving.nodes instead of the stack's")
    parser.add_argument("--values", type=Path, help="a Soperator values file instead of the stack's values")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        values = (read_soperator_values(args.values) if args.values
                  else cluster_stack_values(read_stack(args.stack_file, args.nodes, args.serving_nodes)))
        write_rehearsal(values, args.out)
    except (StackConfigError, DocumentError, ValueError) as error:
        print(f"local-cluster: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
