"""slurm.conf's node and partition lines as Soperator 4.1.7's operator writes them, from the SlurmCluster and NodeSet
custom resources Helm renders from the releases' values (``custom_resources``), and the command its worker image
starts slurmd with. Each rule cites nebius/soperator at tag 4.1.7; the rehearsal cluster (scripts/local-cluster.sh)
starts from these lines, so a stack whose values give a worker no node line fails there as it fails on the cloud:
that worker's slurmd finds no NodeName for its hostname and exits."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

from documents.soperator_values import (
    NODESET_KIND,
    SLURM_CLUSTER_KIND,
    NodeSetResource,
    OperatorResources,
    SoperatorValues,
    read_custom_resources,
)
from infra.config import SoperatorConfig
from infra.soperator.helm_render import HelmRelease, render, served_versions
from infra.soperator.values import SOPERATOR_NAMESPACE, chart_ref

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"m": -1, "": 0, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_QUANTITY = re.compile(r"^\+?(\d+(?:\.\d*)?|\.\d+)(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?)$")


def with_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """`value` as the API server stores it under a CRD's structural `schema`: every absent (or null, where not
    nullable) property that has a ``default`` gets a copy of it, inside every object that is present
    (k8s.io/apiextensions-apiserver pkg/apiserver/schema/defaulting/algorithm.go, Default)."""
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        out = dict(value)
        for key, prop in properties.items():
            if "default" in prop and (key not in out or (out[key] is None and not prop.get("nullable"))):
                out[key] = copy.deepcopy(prop["default"])
        extra = schema.get("additionalProperties")
        for key, item in out.items():
            sub = properties.get(key, extra if isinstance(extra, Mapping) else None)
            if sub is not None:
                out[key] = with_defaults(item, sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [with_defaults(item, schema["items"]) for item in value]
    return value


def _crd_schemas(objects: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """(``group/version``, kind) -> openAPIV3Schema of every served version of the CRDs among `objects`."""
    return {(group_version, kind): version["schema"]["openAPIV3Schema"]
            for group_version, kind, version in served_versions(objects)}


def custom_resources(values: SoperatorValues, soperator: SoperatorConfig | None = None, *, mirror: Path | None,
                     kube_version: str) -> OperatorResources:
    """The SlurmCluster and NodeSets the operator reads for `values`: helm-soperator-crds, then helm-slurm-cluster
    and helm-nodesets (seeing its CRDs) rendered with Helm at `soperator`'s version (from `mirror`, else their
    registry), as the program installs them (infra/soperator/values.py release_plan), each custom resource with its
    CRD's defaults."""
    sop = soperator or SoperatorConfig()

    def release(key: str, namespace: str, chart_values: Mapping[str, Any]) -> HelmRelease:
        return HelmRelease(name=key, chart=chart_ref(sop.registry, key), version=sop.version, namespace=namespace,
                           values=chart_values)

    crds = render(release("soperator-crds", SOPERATOR_NAMESPACE, {}), mirror=mirror, kube_version=kube_version)
    schemas = _crd_schemas(crds.objects)
    objects = []
    for done in (render(r, mirror=mirror, kube_version=kube_version, api_versions=crds.api_versions())
                 for r in (release("slurm-cluster", values.namespace, values.slurm_cluster),
                           release("nodesets", values.namespace, {"nodesets": values.nodesets}))):
        objects += [with_defaults(o, schemas[(o["apiVersion"], o["kind"])]) for o in done.objects
                    if o.get("kind") in (SLURM_CLUSTER_KIND, NODESET_KIND)]
    return read_custom_resources(objects, f"Soperator {sop.version}'s helm-slurm-cluster and helm-nodesets")


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


def real_memory_mib(nodeset: NodeSetResource) -> int:
    """RealMemory: the slurmd container's memory request in whole MiB (internal/render/common/configmap.go:758-762)."""
    try:
        return quantity_bytes(nodeset.spec.slurmd.resources.memory) // 1_048_576
    except ValueError as error:
        raise ValueError(f"NodeSet {nodeset.metadata.name}: spec.slurmd.resources.memory {error}") from None


def node_address(pod: str, cluster_name: str, namespace: str) -> str:
    """NodeAddr: the pod's name under the NodeSets' umbrella Service (configmap.go:130-134;
    internal/naming/naming.go:68-76: `<cluster>-nodeset-svc.<namespace>.svc.cluster.local`)."""
    return f"{pod}.{cluster_name}-nodeset-svc.{namespace}.svc.cluster.local"


def cluster_nodesets(resources: OperatorResources) -> list[NodeSetResource]:
    """The NodeSets the operator renders the cluster with: those of its namespace, which the NodeSet webhook ties to
    the one SlurmCluster there (internal/webhook/v1alpha1/nodeset_webhook.go:72-86), sorted by name
    (internal/utils/resourcegetter/nodeset.go:20-45)."""
    namespace = resources.cluster.metadata.namespace
    return sorted((n for n in resources.nodesets if n.metadata.namespace == namespace), key=lambda n: n.metadata.name)


def pods(resources: OperatorResources) -> list[str]:
    """Every worker pod of the cluster's NodeSets, `<nodeset>-<i>` (a StatefulSet's pod names), in the operator's
    order."""
    return [f"{n.metadata.name}-{i}" for n in cluster_nodesets(resources) for i in range(n.spec.replicas)]


def _node_lines(resources: OperatorResources) -> list[str]:
    """configmap.go:110-181 AddNodesToSlurmConfig (a NodeSet of 0 replicas is skipped: 124-127)."""
    cluster, lines = resources.cluster.metadata, []
    for nodeset in cluster_nodesets(resources):
        spec = nodeset.spec
        memory = real_memory_mib(nodeset) if spec.replicas else 0
        for i in range(spec.replicas):
            pod = f"{nodeset.metadata.name}-{i}"
            # 141-148: hostname, address (the NodeSet's namespace, the cluster's name), memory, the port unless 0
            config = (f"NodeHostname={pod} NodeAddr={node_address(pod, cluster.name, nodeset.metadata.namespace)} "
                      f"RealMemory={memory}" + (f" Port={spec.slurmd.port}" if spec.slurmd.port else ""))
            # 151-154: features joined by commas under the key `Feature=`
            if spec.node_config.features:
                config += " Feature=" + ",".join(spec.node_config.features)
            # 157-167: the static string split on single spaces, Feature= and State= overrides dropped
            static = " ".join(s for s in spec.node_config.static.split(" ")
                              if not s.startswith("Feature=") and not s.startswith("State="))
            # 169-178: appended after one space (an empty static leaves it trailing); every node static, State=CLOUD
            lines.append(f"NodeName={pod} State=CLOUD {config} {static}")
    return lines


def _partition_lines(resources: OperatorResources) -> list[str]:
    """configmap.go:188-208 AddPartitionsToSlurmConfig (a partition neither `isAll` nor with refs is skipped)."""
    lines = []
    for partition in resources.cluster.spec.partition_configuration.partitions:
        if partition.is_all:
            lines.append(f"PartitionName={partition.name} Nodes=ALL {partition.config}")
        elif partition.node_set_refs:
            lines.append(f"PartitionName={partition.name} Nodes={','.join(partition.node_set_refs)} {partition.config}")
    return lines


def _nodeset_lines(resources: OperatorResources) -> list[str]:
    """configmap.go:86-103 AddNodeSetsToSlurmConfig (0 replicas: skipped)."""
    lines = []
    for nodeset in cluster_nodesets(resources):
        name, replicas = nodeset.metadata.name, nodeset.spec.replicas
        if replicas:
            lines.append(f"NodeSet={name} Nodes={name}-0" if replicas == 1
                         else f"NodeSet={name} Nodes={name}-[0-{replicas - 1}]")
    return lines


def slurm_conf_lines(resources: OperatorResources) -> list[str]:
    """The NodeName, PartitionName and NodeSet lines of the slurm.conf the operator renders from the SlurmCluster
    and its NodeSets (configmap.go:369-386), comments left out."""
    partitions = resources.cluster.spec.partition_configuration
    if partitions.config_type == "custom":
        # 370-377: only the raw lines that start with PartitionName; no node line
        return [line.strip() for line in partitions.raw_config if line.strip().startswith("PartitionName")]
    if partitions.config_type == "structured":
        # 378-381: nodes, partitions, nodesets
        return [*_node_lines(resources), *_partition_lines(resources), *_nodeset_lines(resources)]
    # 383-385: the default partitions over ALL nodes, and no node line at all
    return ["PartitionName=main Nodes=ALL Default=YES PriorityTier=10 MaxTime=INFINITE State=UP OverSubscribe=YES",
            "PartitionName=hidden Nodes=ALL Default=NO PriorityTier=10 PreemptMode=OFF Hidden=YES MaxTime=INFINITE "
            "State=UP OverSubscribe=YES"]


def slurmd_entrypoint_args(instance_id: str) -> list[str]:
    """The worker's slurmd arguments (images/worker/slurmd_entrypoint.sh:50-60, `--extra` left out): a static node
    (no -Z, no --conf; dynamic workers are gone), found in slurm.conf by its hostname, reporting a boot."""
    return ["-D", "--instance-id", instance_id, "-b"]
