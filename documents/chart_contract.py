"""Chart contract files (`infra/soperator/charts/<family>-<version>.yaml`): which Helm value paths the program may pass to
each chart of a pinned release, written by a person from reading the charts at their tag.

`ContractFile` is the one definition of the file and `read_contract_file` its one reader. A file either lists
every chart's `keys`, or `extends` an older version and lists per chart what was `add`ed and `remove`d.
`ChartContract` is one chart's resolved contract (infra/soperator/chart_contract.py resolves `extends` and checks values).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from documents.base import DocumentError, describe

LIST_ITEM = "[]"
ANY_KEY = "*"


class ContractError(DocumentError):
    """No contract for a chart version, or a malformed contract file."""


class KeyRule(BaseModel):
    """One admitted value path and the custom-resource field (or object) it lands in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    lands: str
    read: str = ""
    subtree: bool = Field(False, description="every path below is passed through toYaml unchanged")
    schema_: str | None = Field(None, alias="schema", description="below: only this schema's first-level keys")
    required: bool = False
    required_when: str | None = Field(None, description="required when this other path is truthy")
    null_only: bool = Field(False, description="may only be null (Helm drops the chart default)")

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))


class Schema(BaseModel):
    """The first-level keys a CRD keeps below a path (`schema: NAME` in a rule)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: tuple[str, ...]


class HardCodedLine(BaseModel):
    """A line of a chart's script or template, copied verbatim, that names a Kubernetes object literally instead of
    from values (a Slurm cluster, its namespace, or an object named after them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str = Field(description="path inside the chart folder, e.g. scripts/ssh-check.sh")
    line: int = Field(gt=0)
    text: str = Field(min_length=1)


class ChartEntry(BaseModel):
    """One chart in a contract file: its full `keys`, or (in a file that `extends`) what changed; `hard_coded`
    lists the chart's lines with literal names (a file that `extends` and lists none keeps the older version's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    read: str = ""
    keys: tuple[KeyRule, ...] | None = None
    add: tuple[KeyRule, ...] = ()
    remove: tuple[str, ...] = ()
    hard_coded: tuple[HardCodedLine, ...] = ()


class ContractFile(BaseModel):
    """A whole contract file: one release (chart family) at one version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    source: str
    extends: str | None = None
    schemas: dict[str, Schema] = {}
    charts: dict[str, ChartEntry]

    @model_validator(mode="after")
    def _keys_or_changes(self) -> ContractFile:
        for name, chart in self.charts.items():
            if self.extends is None and (chart.keys is None or chart.add or chart.remove):
                raise ValueError(f"charts.{name}: a file that extends nothing lists 'keys' (not add/remove)")
            if self.extends is not None and chart.keys is not None:
                raise ValueError(f"charts.{name}: a file that extends {self.extends} lists 'add'/'remove', not 'keys'")
        return self


class ChartContract(BaseModel):
    """One chart's resolved contract at one version."""

    model_config = ConfigDict(frozen=True)

    chart: str
    version: str
    source: str
    keys: tuple[KeyRule, ...]
    schemas: dict[str, tuple[str, ...]]

    def rule_for(self, path: tuple[str, ...]) -> tuple[KeyRule, tuple[str, ...]] | None:
        """The rule admitting ``path`` and the part of the path below the rule's own."""
        for rule in self.keys:
            n = len(rule.segments)
            if len(path) < n or not all(_segment_matches(r, p) for r, p in zip(rule.segments, path)):
                continue
            rest = path[n:]
            if not rest or rule.subtree:
                return rule, rest
            if rule.schema_ is not None and rest[0] in self.schemas[rule.schema_]:
                return rule, rest
        return None


def _segment_matches(rule: str, actual: str) -> bool:
    return rule == actual or (rule == ANY_KEY and actual != LIST_ITEM)


def read_contract_file(path: Path) -> ContractFile:
    """The contract file at `path`, or a ContractError naming the file and each bad field."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ContractError(f"{path}: cannot read chart contract: {error}") from None
    try:
        return ContractFile.model_validate(document)
    except ValidationError as error:
        raise ContractError(f"{path}: not a valid chart contract ({describe(error)})") from None
