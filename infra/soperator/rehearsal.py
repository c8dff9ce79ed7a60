"""The rehearsal cluster's Slurm nodes as Soperator would make them (scripts/local-cluster.sh runs this module).

A `cluster` stack (an existing Slurm, no Soperator) is described by the helm-slurm-cluster and helm-nodesets values a
Soperator install of the same nodes would get, as the nebius stacks send them (infra/soperator/values.py):
structured partitions, the training partition over the workers' NodeSet, Soperator's hidden one over all, the serving
one over the serving NodeSet, and each NodeSet's `nodeConfig.static` with its CPUs (and Gres). Helm renders them into
the SlurmCluster and NodeSet custom resources, and the rehearsal writes slurm.conf's node and partition lines from
those, as the operator does (infra/soperator/render.py), and names and addresses its nodes as the pods.

    python -m infra.soperator.rehearsal --stack-file stacks/Pulumi.cluster.yaml [--nodes N] [--serving-nodes K]
                                        [--values FILE] --out DIR

writes DIR/values.yaml (the values used; --values FILE instead of the stack's), DIR/custom-resources.yaml (what Helm
rendered from them, CRD defaults applied), DIR/nodes.conf (the lines), DIR/pods (`<pod> <address>` per worker pod)
and DIR/slurmd.args (how slurmd starts). The charts come from FT_CHART_MIRROR, else ../shared/upstream/charts beside
the checkout, else Soperator's registry.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from documents.atomic import atomic_file
from documents.base import DocumentError
from documents.soperator_values import SoperatorValues, read_soperator_values, write_soperator_values
from infra.config import (
    PROJECT,
    REPO_ROOT,
    SERVING_HIDDEN,
    NebiusConfig,
    StackConfig,
    StackConfigError,
    parse_stack_config,
    serving_nodeset_name,
    split_namespace,
)
from infra.nebius.layout import JAIL
from infra.soperator.helm_render import HelmRenderError, kube_version, mirror_beside
from infra.soperator.render import custom_resources, node_address, pods, slurm_conf_lines, slurmd_entrypoint_args
from infra.soperator.values import (
    HIDDEN_PARTITION_CONFIG,
    MAIN_PARTITION_CONFIG,
    SERVING_PARTITION_CONFIG,
    WORKER_MUNGE,
)

WORKER_NODESET = "worker"
"""The NodeSet of a `cluster` stack's workers (its pods, and Slurm nodes, are worker-0, worker-1, ...)."""


def node_static(cpus: int, gpus: int) -> str:
    """`nodeConfig.static` of a node with `cpus` single-threaded cores on one socket, and its GPUs (untyped Gres:
    an existing cluster's stack does not name the GPU model)."""
    topology = f"CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1"
    return f"{topology} Gres=gpu:{gpus}" if gpus else topology


KUBE_VERSION = kube_version(NebiusConfig.model_fields["k8s_version"].default)
"""The Kubernetes version Helm renders for: a new nebius stack's (a `cluster` stack has none)."""


def _nodeset(name: str, replicas: int, cfg: StackConfig) -> dict[str, Any]:
    """One NodeSet's helm-nodesets values: the keys the chart requires (nodeset.yaml: slurmd resources and volumes,
    munge resources), the node's features and static, slurmd's CPUs and memory as its request."""
    cluster = cfg.cluster
    assert cluster is not None
    gpus = cluster.gpus_per_node
    node_config = {"features": ["gpu"] if gpus else ["cpu"], "static": node_static(cluster.cpus_per_node, gpus)}
    return {"name": name, "replicas": replicas, "nodeConfig": node_config,
            "slurmd": {"resources": {"cpu": str(cluster.cpus_per_node), "memory": f"{cluster.memory_gib_per_node}Gi"},
                       "volumes": {"spool": {"emptyDir": {}},
                                   "jail": {"persistentVolumeClaim": {"claimName": f"{JAIL}-pvc"}}}},
            "munge": {"resources": WORKER_MUNGE.values()}}


def cluster_stack_values(cfg: StackConfig) -> SoperatorValues:
    """The Soperator values equivalent to a `cluster` stack's nodes (cluster.nodes, cpusPerNode, gpusPerNode,
    memoryGibPerNode; serving.nodes of them in a serving NodeSet)."""
    if cfg.cluster is None:
        raise StackConfigError(f"stack {cfg.stack}: target {cfg.target} has no cluster section; only a cluster "
                               "stack describes its nodes this way")
    serving = cfg.serving.nodes
    nodesets = [_nodeset(WORKER_NODESET, cfg.cluster.nodes - serving, cfg)]
    partitions: list[dict[str, Any]] = [
        {"name": cfg.serving.training_partition, "nodeSetRefs": [WORKER_NODESET], "config": MAIN_PARTITION_CONFIG},
        {"name": SERVING_HIDDEN, "isAll": True, "config": HIDDEN_PARTITION_CONFIG}]
    if serving:
        name = serving_nodeset_name(WORKER_NODESET)
        nodesets.append(_nodeset(name, serving, cfg))
        partitions.append({"name": cfg.serving.partition, "nodeSetRefs": [name], "config": SERVING_PARTITION_CONFIG})
    return SoperatorValues(namespace=cfg.slurm_namespace, nodesets=nodesets, slurm_cluster={
        "clusterName": cfg.slurm_cluster_name,
        "partitionConfiguration": {"configType": "structured", "partitions": partitions}})


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
    resources = custom_resources(values, mirror=mirror_beside(REPO_ROOT), kube_version=KUBE_VERSION)
    write_soperator_values(out / "values.yaml", values)
    with atomic_file(out / "custom-resources.yaml") as tmp:
        tmp.write_text(yaml.safe_dump_all([r.model_dump(by_alias=True)
                                           for r in (resources.cluster, *resources.nodesets)], sort_keys=False))
    cluster = resources.cluster.metadata
    for name, lines in (("nodes.conf", slurm_conf_lines(resources)),
                        ("pods", [f"{p} {node_address(p, cluster.name, cluster.namespace)}" for p in pods(resources)]),
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
    except (StackConfigError, DocumentError, HelmRenderError, ValueError) as error:
        print(f"local-cluster: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
