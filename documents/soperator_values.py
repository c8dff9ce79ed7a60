"""A Soperator install's Slurm side, before and after Helm (infra/soperator/render.py).

`SoperatorValues` is what the releases send: the namespace, the `helm-slurm-cluster` chart's values and the
`helm-nodesets` chart's `nodesets`, kept whole (Helm applies the charts' defaults and `required`s to them); it is the
rehearsal's values file (scripts/local-cluster.sh `--values`), read and written by `read_soperator_values` and
`write_soperator_values`. `SlurmClusterResource` and `NodeSetResource` are what the operator reads: the custom
resources Helm rendered from them, as the API server stores them (their CRDs' defaults applied), with only the fields
Soperator 4.1.7 writes into slurm.conf's node and partition lines; a field still absent is its Go type's zero value,
as the operator sees it (api/v1/slurmcluster_types.go, api/v1alpha1/nodeset_types.go). `read_custom_resources`
is their reader.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from documents.atomic import atomic_file
from documents.base import DocumentError, describe

SLURM_CLUSTER_KIND = "SlurmCluster"
NODESET_KIND = "NodeSet"


class _Fields(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class SoperatorValues(_Fields):
    """What one Slurm cluster is rendered from: its namespace (the releases' and the NodeSets'), helm-slurm-cluster's
    values and helm-nodesets' NodeSets."""

    namespace: str = Field(min_length=1)
    slurm_cluster: dict[str, Any] = {}
    """helm-slurm-cluster's values (``clusterName``, ``partitionConfiguration``, ...)."""
    nodesets: list[dict[str, Any]]
    """helm-nodesets' ``nodesets`` (``name``, ``replicas``, ``nodeConfig``, ``slurmd``, ``munge``, ...)."""


def read_soperator_values(path: Path) -> SoperatorValues:
    """The values file at `path`, or a DocumentError naming the file and each bad field."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise DocumentError(f"{path}: cannot read the Soperator values: {error}") from None
    try:
        return SoperatorValues.model_validate(document)
    except ValidationError as error:
        raise DocumentError(f"{path}: not valid Soperator values ({describe(error)})") from None


def write_soperator_values(path: Path, values: SoperatorValues) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(yaml.safe_dump(values.model_dump(by_alias=True), sort_keys=False))


class Metadata(_Fields):
    name: str = Field(min_length=1)
    namespace: str = Field(min_length=1)


class Partition(_Fields):
    """One structured partition (SlurmCluster ``spec.partitionConfiguration.partitions[]``)."""

    name: str = Field(min_length=1)
    is_all: bool = False
    node_set_refs: list[str] = []
    config: str = ""


class PartitionConfiguration(_Fields):
    config_type: Literal["default", "custom", "structured"]
    """Always present: the chart writes it (slurm-cluster-cr.yaml:46) and the CRD defaults it to ``default``."""
    raw_config: list[str] = []
    partitions: list[Partition] = []

    @model_validator(mode="after")
    def _structured_has_partitions(self) -> PartitionConfiguration:
        # api/v1/slurmcluster_types.go:379 (the CRD's validation rule): the API server refuses the SlurmCluster
        if self.config_type == "structured" and not self.partitions:
            raise ValueError("Structured partition configuration requires at least one partition")
        return self


class SlurmClusterSpec(_Fields):
    partition_configuration: PartitionConfiguration


class SlurmClusterResource(_Fields):
    api_version: str = Field(min_length=1)
    kind: Literal["SlurmCluster"]
    metadata: Metadata
    spec: SlurmClusterSpec


class NodeConfig(_Fields):
    features: list[str] = []
    static: str = ""


class SlurmdResources(_Fields):
    memory: str = "0"
    """The slurmd container's memory request, a Kubernetes quantity (``"500Mi"``, ``"1220Gi"``)."""

    @field_validator("memory", mode="before")
    @classmethod
    def _quantity_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, (int, float)) else value


class SlurmdSpec(_Fields):
    port: int = 0
    resources: SlurmdResources = SlurmdResources()


class NodeSetSpec(_Fields):
    replicas: int = Field(0, ge=0)
    node_config: NodeConfig = NodeConfig()
    slurmd: SlurmdSpec = SlurmdSpec()


class NodeSetResource(_Fields):
    api_version: str = Field(min_length=1)
    kind: Literal["NodeSet"]
    metadata: Metadata
    spec: NodeSetSpec


@dataclass(frozen=True)
class OperatorResources:
    """The SlurmCluster and the NodeSets of its namespace: what the operator renders slurm.conf from."""

    cluster: SlurmClusterResource
    nodesets: tuple[NodeSetResource, ...]


def read_custom_resources(objects: Iterable[Mapping[str, Any]], origin: str) -> OperatorResources:
    """The one SlurmCluster and the NodeSets among `objects`, or a DocumentError naming `origin`, the object and each
    bad field."""
    clusters, nodesets = [], []
    for obj in objects:
        kind = obj.get("kind")
        model = {SLURM_CLUSTER_KIND: SlurmClusterResource, NODESET_KIND: NodeSetResource}.get(str(kind))
        if model is None:
            continue
        name = (obj.get("metadata") or {}).get("name")
        try:
            (clusters if model is SlurmClusterResource else nodesets).append(model.model_validate(obj))
        except ValidationError as error:
            raise DocumentError(f"{origin}: {kind} {name}: {describe(error)}") from None
    if len(clusters) != 1:
        raise DocumentError(f"{origin}: {len(clusters)} SlurmCluster objects; the operator renders one per namespace")
    return OperatorResources(clusters[0], tuple(nodesets))
