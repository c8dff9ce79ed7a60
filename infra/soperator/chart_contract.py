"""Chart contracts: which Helm value key paths the program may pass to each pinned chart version.

The data lives in ``infra/soperator/charts/*.yaml``, written from reading each chart at its tag (the files name the
chart, version and templates read; their model and reader are in documents/chart_contract.py). A contract may
``extends`` an older version and list only what changed (``add``/``remove`` per chart), so a new Soperator
release shows its differences as data.
``violations`` walks a values document and names every path the contract does not admit, every
``required`` path that is missing and every ``null_only`` path given a value.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from documents.chart_contract import LIST_ITEM, ChartContract, ContractError, HardCodedLine, KeyRule, read_contract_file

CHARTS_DIR = Path(__file__).resolve().parent / "charts"
__all__ = ["ChartContract", "ContractError", "admits", "changes", "contract", "hard_coded", "leaf_paths", "versions",
           "violations"]


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


def _file(family: str, version: str) -> Path:
    return CHARTS_DIR / f"{family}-{version}.yaml"


@cache
def _resolved(family: str, version: str) -> tuple[dict[str, tuple[KeyRule, ...]], dict[str, tuple[str, ...]], str]:
    """Every chart's rules, the schemas and the source of `family` at `version`, `extends` applied."""
    path = _file(family, version)
    if not path.is_file():
        known = sorted(p.stem.removeprefix(f"{family}-") for p in CHARTS_DIR.glob(f"{family}-*.yaml"))
        raise ContractError(f"no chart contract for {family} {version} ({path} is missing); "
                            f"known versions: {', '.join(known)}. Read the charts at that tag and add it")
    document = read_contract_file(path)
    if document.extends is None:
        charts = {name: chart.keys or () for name, chart in document.charts.items()}
        schemas: dict[str, tuple[str, ...]] = {}
    else:
        charts, schemas, _ = _resolved(family, document.extends)
        charts, schemas = dict(charts), dict(schemas)
        for name, change in document.charts.items():
            kept = tuple(r for r in charts.get(name, ()) if r.path not in set(change.remove))
            charts[name] = kept + change.add
    schemas.update({name: schema.keys for name, schema in document.schemas.items()})
    return charts, schemas, document.source


def contract(family: str, version: str, chart: str) -> ChartContract:
    """The contract of one chart (e.g. ``nodesets``) of a chart family (``soperator``) at ``version``."""
    charts, schemas, source = _resolved(family, version)
    if chart not in charts:
        raise ContractError(f"{_file(family, version)}: no contract for chart {chart!r}")
    rules = charts[chart]
    for rule in rules:
        if rule.schema_ is not None and rule.schema_ not in schemas:
            raise ContractError(f"{_file(family, version)}: {chart} {rule.path}: unknown schema {rule.schema_!r}")
    return ChartContract(chart=chart, version=version, source=source, keys=rules, schemas=schemas)


def hard_coded(family: str, version: str, chart: str) -> tuple[HardCodedLine, ...]:
    """The chart's lines with literal names at ``version``: its own file's, else those of the version it extends."""
    document = read_contract_file(_file(family, version)) if _file(family, version).is_file() else None
    if document is None:
        _resolved(family, version)  # raises the missing-contract error
        return ()
    entry = document.charts.get(chart)
    if entry is not None and entry.hard_coded:
        return entry.hard_coded
    return hard_coded(family, document.extends, chart) if document.extends else ()


def admits(family: str, version: str, chart: str, path: str) -> bool:
    """Whether the chart at that version reads ``path`` (dotted); used to emit version-specific keys."""
    return contract(family, version, chart).rule_for(tuple(path.split("."))) is not None


def changes(family: str, old: str, new: str) -> dict[str, dict[str, list[str]]]:
    """Per chart, the paths added and removed between two contract versions."""
    a, _, _ = _resolved(family, old)
    b, _, _ = _resolved(family, new)
    out: dict[str, dict[str, list[str]]] = {}
    for chart in sorted(set(a) | set(b)):
        before = {r.path for r in a.get(chart, ())}
        after = {r.path for r in b.get(chart, ())}
        if before != after:
            out[chart] = {"added": sorted(after - before), "removed": sorted(before - after)}
    return out


def versions(family: str) -> Iterable[str]:
    return sorted(p.stem.removeprefix(f"{family}-") for p in CHARTS_DIR.glob(f"{family}-*.yaml"))
