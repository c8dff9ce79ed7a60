"""What a Helm release receives: values without any null, and the chart defaults to delete as ``key: null`` in a YAML
document for ``value_yaml_files``.

Pulumi's Python SDK drops ``None`` from a Release's ``values`` before they reach the engine (pulumi/pulumi #12178), so
a ``None`` there silently keeps the chart's default. pulumi-kubernetes documents the way to delete a default from
Python (pulumi-kubernetes #4306, provider 4.30 on): a ``key: null`` entry in a ``value_yaml_files`` document, merged
under ``values``. Helm then drops the key from the chart's defaults.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

Path = tuple[str, ...]


def null_paths(values: Any, prefix: Path = ()) -> list[str]:
    """Every path (dotted, list items as ``[i]``) whose value is None."""
    if values is None:
        return [".".join(prefix)]
    if isinstance(values, Mapping):
        return [p for k, v in values.items() for p in null_paths(v, (*prefix, str(k)))]
    if isinstance(values, (list, tuple)):
        return [p for i, v in enumerate(values) for p in null_paths(v, (*prefix, f"[{i}]"))]
    return []


def deletion_document(deletions: Iterable[Path]) -> dict[str, Any]:
    """``[("a", "b")]`` -> ``{"a": {"b": None}}``: the chart defaults to drop."""
    document: dict[str, Any] = {}
    for path in deletions:
        node = document
        for segment in path[:-1]:
            node = node.setdefault(segment, {})
            if not isinstance(node, dict):
                raise ValueError(f"deletion {'.'.join(path)}: {segment} is already deleted above it")
        node[path[-1]] = None
    return document


def deletion_yaml(deletions: Iterable[Path]) -> str:
    return yaml.safe_dump(deletion_document(deletions), sort_keys=True)


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged onto ``base`` key by key, as pulumi-kubernetes merges ``values`` onto ``value_yaml_files``."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
