"""The Soperator values a Slurm cluster is rendered from (infra/soperator/render.py): the `slurm-cluster` chart's
`clusterName` and `partitionConfiguration`, and the `nodesets` chart's NodeSets, at 4.1.7. Only the keys the operator
reads into slurm.conf's node and partition lines are modelled; the other keys of a values document are ignored.
The chart's own defaults are applied where its templates apply them (each cited). `SoperatorValues` is the
rehearsal's values file (scripts/local-cluster.sh `--values`); `read_soperator_values`/`write_soperator_values` are
its reader and writer."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from documents.atomic import atomic_file
from documents.base import DocumentError, describe


class _Values(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class Partition(_Values):
    """One structured partition (slurm-cluster chart `partitionConfiguration.partitions[]`, CRD `Partition`)."""

    name: str = Field(min_length=1)
    is_all: bool = False
    node_set_refs: list[str] = []
    config: str = ""


class PartitionConfiguration(_Values):
    config_type: Literal["default", "custom", "structured"] = "default"
    """helm/slurm-cluster/templates/slurm-cluster-cr.yaml:46 `default "default"` (CRD default too:
    api/v1/slurmcluster_types.go:393)."""
    raw_config: list[str] = []
    partitions: list[Partition] = []

    @model_validator(mode="after")
    def _structured_has_partitions(self) -> PartitionConfiguration:
        # api/v1/slurmcluster_types.go:379 (CRD validation rule): the API server refuses the SlurmCluster
        if self.config_type == "structured" and not self.partitions:
            raise ValueError("Structured partition configuration requires at least one partition")
        return self


class SlurmClusterValues(_Values):
    cluster_name: str = "slurm-cluster"
    """The SlurmCluster's name: helm/slurm-cluster/templates/_helpers.tpl:3,
    `default .Chart.Name .Values.clusterName`."""
    partition_configuration: PartitionConfiguration = PartitionConfiguration()


class NodeConfig(_Values):
    features: list[str] = []
    static: str = ""


class SlurmdResourcesValues(_Values):
    memory: str = Field(min_length=1)
    """A Kubernetes quantity (``"500Mi"``, ``"1220Gi"``); required by helm/nodesets/templates/nodeset.yaml:112."""


class SlurmdValues(_Values):
    port: int = 6818
    """helm/nodesets/templates/nodeset.yaml:99 `.port | default 6818`."""
    resources: SlurmdResourcesValues

    @field_validator("port", mode="before")
    @classmethod
    def _chart_default(cls, value: Any) -> Any:
        return value or 6818


class NodeSetValues(_Values):
    """One NodeSet (nodesets chart `nodesets[]`)."""

    name: str = Field(min_length=1)
    replicas: int = Field(1, ge=0)
    """helm/nodesets/templates/nodeset.yaml:22 `.replicas | default 1`: 0 (or none) becomes 1."""
    ephemeral_nodes: bool = False
    node_config: NodeConfig = NodeConfig()
    slurmd: SlurmdValues

    @field_validator("replicas", mode="before")
    @classmethod
    def _chart_default(cls, value: Any) -> Any:
        return value or 1


class SoperatorValues(_Values):
    """What one Slurm cluster is rendered from: its namespace (the Helm releases' and the NodeSets'), the
    slurm-cluster chart's values and the nodesets chart's NodeSets."""

    namespace: str = Field(min_length=1)
    slurm_cluster: SlurmClusterValues
    nodesets: list[NodeSetValues]


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
