"""Chart contracts: which Helm value key paths the program may pass to each pinned chart version.

The data lives in ``infra/charts/*.yaml``, written from reading each chart at its tag (the files name the
chart, version and templates read). A contract may ``extends`` an older version and list only what
changed (``add``/``remove`` per chart), so a new Soperator release shows its differences as data.
``violations`` walks a values document and names every path the contract does not admit, every
``required`` path that is missing and every ``null_only`` path given a value.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

CHARTS_DIR = Path(__file__).resolve().parent / "charts"
LIST_ITEM = "[]"
ANY_KEY = "*"


class ContractError(ValueError):
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


class ChartContract(BaseModel):
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
            if len(path) < n or not all(_seg_match(r, p) for r, p in zip(rule.segments, path)):
                continue
            rest = path[n:]
            if not rest:
                return rule, rest
            if rule.subtree:
                return rule, rest
            if rule.schema_ is not None and rest[0] in self.schemas[rule.schema_]:
                return rule, rest
        return None


def _seg_match(rule: str, actual: str) -> bool:
    return rule == actual or (rule == ANY_KEY and actual != LIST_ITEM)


def leaf_paths(values: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf of a values document as (path segments, value); list items become ``[]``."""
    if isinstance(values, Mapping) and values:
        for key, value in values.items():
            yield from leaf_paths(value, (*prefix, str(key)))
    elif isinstance(values, list) and values and all(isinstance(v, (Mapping, list)) for v in values):
        for value in values:
            yield from leaf_paths(value, (*prefix, LIST_ITEM))
    else:
        yield prefix, values


def _present(values: Any, segments: tuple[str, ...]) -> bool:
    if not segments:
        return True
    head, rest = segments[0], segments[1:]
    if isinstance(values, list) and head == LIST_ITEM:
        return bool(values) and all(_present(v, rest) for v in values)
    if isinstance(values, Mapping) and head in values:
        return values[head] is not None and _present(values[head], rest)
    return False


def _truthy(values: Any, segments: list[str]) -> bool:
    for seg in segments:
        if not isinstance(values, Mapping) or seg not in values:
            return False
        values = values[seg]
    return bool(values)


def violations(contract: ChartContract, values: Mapping[str, Any]) -> list[str]:
    """What in ``values`` the chart version does not read (or its CRD prunes), and what it requires."""
    found = []
    where = f"{contract.chart} {contract.version}"
    for path, value in leaf_paths(values):
        if not path:
            continue
        dotted = ".".join(path)
        match = contract.rule_for(path)
        if match is None:
            found.append(f"{where}: {dotted} is not a value the chart reads or its CRD keeps")
        elif match[0].null_only and value is not None:
            found.append(f"{where}: {dotted} may only be null (drops the chart default), got {value!r}")
    for rule in contract.keys:
        needed = rule.required or (rule.required_when is not None and _truthy(values, rule.required_when.split(".")))
        if needed and not _present(values, rule.segments):
            found.append(f"{where}: {rule.path} is required ({rule.lands})")
    return found


def _load_file(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ContractError(f"{path}: cannot read chart contract: {exc}") from None
    if not isinstance(doc, dict) or "charts" not in doc or "version" not in doc:
        raise ContractError(f"{path}: a chart contract needs 'version' and 'charts'")
    return doc


def _file(family: str, version: str) -> Path:
    return CHARTS_DIR / f"{family}-{version}.yaml"


@cache
def _resolved(family: str, version: str) -> tuple[dict[str, list[dict[str, Any]]], dict[str, tuple[str, ...]], str]:
    path = _file(family, version)
    if not path.is_file():
        known = sorted(p.stem.removeprefix(f"{family}-") for p in CHARTS_DIR.glob(f"{family}-*.yaml"))
        raise ContractError(f"no chart contract for {family} {version} ({path} is missing); "
                            f"known versions: {', '.join(known)}. Read the charts at that tag and add it")
    doc = _load_file(path)
    if "extends" in doc:
        charts, schemas, _ = _resolved(family, str(doc["extends"]))
        charts = {name: list(rules) for name, rules in charts.items()}
        schemas = dict(schemas)
        for name, change in doc["charts"].items():
            removed = set(change.get("remove", []))
            kept = [r for r in charts.get(name, []) if r["path"] not in removed]
            charts[name] = kept + list(change.get("add", []))
    else:
        charts = {name: list(chart["keys"]) for name, chart in doc["charts"].items()}
        schemas = {}
    schemas.update({name: tuple(s["keys"]) for name, s in (doc.get("schemas") or {}).items()})
    return charts, schemas, str(doc.get("source", path.name))


def contract(family: str, version: str, chart: str) -> ChartContract:
    """The contract of one chart (e.g. ``nodesets``) of a chart family (``soperator``) at ``version``."""
    charts, schemas, source = _resolved(family, version)
    if chart not in charts:
        raise ContractError(f"{_file(family, version)}: no contract for chart {chart!r}")
    rules = tuple(KeyRule.model_validate(r) for r in charts[chart])
    for rule in rules:
        if rule.schema_ is not None and rule.schema_ not in schemas:
            raise ContractError(f"{_file(family, version)}: {chart} {rule.path}: unknown schema {rule.schema_!r}")
    return ChartContract(chart=chart, version=version, source=source, keys=rules, schemas=schemas)


def admits(family: str, version: str, chart: str, path: str) -> bool:
    """Whether the chart at that version reads ``path`` (dotted); used to emit version-specific keys."""
    return contract(family, version, chart).rule_for(tuple(path.split("."))) is not None


def changes(family: str, old: str, new: str) -> dict[str, dict[str, list[str]]]:
    """Per chart, the paths added and removed between two contract versions."""
    a, _, _ = _resolved(family, old)
    b, _, _ = _resolved(family, new)
    out: dict[str, dict[str, list[str]]] = {}
    for chart in sorted(set(a) | set(b)):
        before = {r["path"] for r in a.get(chart, [])}
        after = {r["path"] for r in b.get(chart, [])}
        if before != after:
            out[chart] = {"added": sorted(after - before), "removed": sorted(before - after)}
    return out


def versions(family: str) -> Iterable[str]:
    return sorted(p.stem.removeprefix(f"{family}-") for p in CHARTS_DIR.glob(f"{family}-*.yaml"))
