"""What the API server would refuse or silently drop from a stack's rendered objects, found before ``pulumi up``.

``check_stack`` walks a stack's install units in order (each Helm release, and each Kubernetes resource of the program
such as k8up's CRDs) and reports, naming stack, unit, object and field:
- a custom resource invalid against its CRD's ``openAPIV3Schema`` (``nullable`` honoured), a field the API server
  would prune (not in the schema; ``x-kubernetes-preserve-unknown-fields`` and embedded resources respected), or a
  version the CRD does not serve;
- a custom resource whose CRD no earlier unit installs (a release's own ``crds/`` folder counts, its templates not:
  Helm maps every template's kind before it creates any);
- a built-in object invalid against the Kubernetes version's strict OpenAPI schema (kubernetes-validate's files);
- an object two units both create (a namespace a release creates itself among them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import referencing

from infra.soperator.helm_render import CRD_KIND

BUILT_IN_GROUPS = frozenset({"", "apps", "batch", "autoscaling", "policy"})
CLUSTER_SCOPED = frozenset({
    "Namespace", "ClusterRole", "ClusterRoleBinding", CRD_KIND, "PriorityClass", "StorageClass",
    "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "PersistentVolume", "APIService", "CSIDriver",
    "IngressClass", "RuntimeClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
})


@dataclass(frozen=True)
class Unit:
    """One thing the program installs, in install order: a Helm release or a Kubernetes resource."""

    name: str
    namespace: str
    objects: tuple[dict[str, Any], ...]
    crd_folder: frozenset[int] = frozenset()
    """Indexes of ``objects`` that Helm installs before the rest (the chart's ``crds/`` folder)."""
    after: frozenset[str] | None = None
    """The units this one waits for (its dependencies, transitively); None: every earlier unit."""
    creates_namespace: str | None = None
    """The namespace a release creates itself (pulumi-kubernetes' ``createNamespace``), which no chart may render."""


@dataclass(frozen=True)
class Finding:
    stack: str
    unit: str
    object: str
    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.stack}: {self.unit}: {self.object}: {self.field or '(object)'}: {self.problem}"


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def is_built_in(obj: Mapping[str, Any]) -> bool:
    group = group_of(str(obj.get("apiVersion", "")))
    return group in BUILT_IN_GROUPS or group.endswith(".k8s.io")


def object_name(obj: Mapping[str, Any], namespace: str) -> str:
    meta = obj.get("metadata") or {}
    kind = obj.get("kind", "?")
    where = "" if kind in CLUSTER_SCOPED else f"{meta.get('namespace') or namespace}/"
    return f"{obj.get('apiVersion', '?')} {kind} {where}{meta.get('name', '?')}"


def dotted(path: Iterable[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _nullable(schema: Any) -> Any:
    """An openAPIV3Schema with ``nullable: true`` as JSON Schema's ``null`` type."""
    if isinstance(schema, list):
        return [_nullable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _nullable(v) for k, v in schema.items()}
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def pruned(value: Any, schema: Mapping[str, Any], path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of fields the API server drops from ``value`` (structural-schema pruning)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from pruned(item, schema["items"], (*path, index))
    if not isinstance(value, dict):
        return
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    embedded = {"apiVersion", "kind", "metadata"} if schema.get("x-kubernetes-embedded-resource") else set()
    for key, item in value.items():
        if key in properties:
            yield from pruned(item, properties[key], (*path, key))
        elif isinstance(extra, dict):
            yield from pruned(item, extra, (*path, key))
        elif extra is not True and key not in embedded:
            yield (*path, key)


@dataclass
class _Crds:
    """CRDs: (group, kind) -> CRD object."""

    known: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)

    def add(self, crd: Mapping[str, Any]) -> None:
        spec = crd.get("spec") or {}
        self.known[(spec.get("group", ""), (spec.get("names") or {}).get("kind", ""))] = crd


def custom_findings(obj: Mapping[str, Any], crd: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, problem) of a custom resource against its CRD: served version, schema, pruned fields."""
    version = str(obj.get("apiVersion", "")).rpartition("/")[2]
    versions = {v.get("name"): v for v in (crd.get("spec") or {}).get("versions", [])}
    chosen = versions.get(version)
    if chosen is None or not chosen.get("served", True):
        served = ", ".join(sorted(n for n, v in versions.items() if v.get("served", True)))
        return [("apiVersion", f"version {version} is not served by {crd['metadata']['name']} (serves {served})")]
    top, validator = _crd_validator(crd, version)
    body = {k: v for k, v in obj.items() if k not in _OBJECT_META}
    found = [(dotted(p), "pruned: not in the CRD's schema") for p in pruned(body, top)]
    found += [(dotted(e.absolute_path), e.message) for e in validator.iter_errors(body)]
    return found


_OBJECT_META = ("apiVersion", "kind", "metadata")
_OPENAPI_V3 = jsonschema.validators.extend(jsonschema.Draft4Validator, type_checker=(
    jsonschema.Draft4Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool)
        or isinstance(v, float) and v.is_integer())))
"""OpenAPI v3.0's schema dialect (JSON Schema draft 4); a whole number written as 1e+07 is an integer, as the API
server's YAML-to-JSON conversion makes it."""
_VALIDATORS: dict[tuple[int, str], tuple[Mapping[str, Any], dict[str, Any], Any]] = {}


def _crd_validator(crd: Mapping[str, Any], version: str) -> tuple[dict[str, Any], Any]:
    """The schema of one served version below apiVersion/kind/metadata, and its validator (kept per CRD object)."""
    key = (id(crd), version)
    if key not in _VALIDATORS:
        chosen = next(v for v in crd["spec"]["versions"] if v.get("name") == version)
        schema = (chosen.get("schema") or {}).get("openAPIV3Schema") or {}
        top = {**schema, "properties": {k: v for k, v in (schema.get("properties") or {}).items()
                                         if k not in _OBJECT_META}}
        _VALIDATORS[key] = (crd, top, _OPENAPI_V3(_nullable(top)))
    _, top, validator = _VALIDATORS[key]
    return top, validator


@cache
def _schema_file(kube_version: str, name: str) -> Any:
    folder = resources.files("kubernetes_validate").joinpath("kubernetes-json-schema", f"v{kube_version}-local-strict")
    if not folder.is_dir():
        raise ValueError(f"kubernetes-validate has no schemas for Kubernetes {kube_version}")
    path = folder.joinpath(name)
    return json.loads(path.read_text()) if path.is_file() else None


@cache
def _registry(kube_version: str) -> referencing.Registry:
    return referencing.Resource.from_contents(_schema_file(kube_version, "_definitions.json")) @ referencing.Registry()


_CHECKED: dict[tuple[int, str], tuple[Mapping[str, Any], list[tuple[str, str]]]] = {}


def built_in_findings(obj: Mapping[str, Any], kube_version: str) -> list[tuple[str, str]]:
    """(field, problem) of a built-in object against Kubernetes' strict schema at ``kube_version``; kept per object
    (a CRD takes seconds, and the renders of one process share their objects, which nobody changes)."""
    key = (id(obj), kube_version)
    if key not in _CHECKED:
        _CHECKED[key] = (obj, _built_in_findings(obj, kube_version))
    return _CHECKED[key][1]


def _built_in_findings(obj: Mapping[str, Any], kube_version: str) -> list[tuple[str, str]]:
    api = str(obj.get("apiVersion", ""))
    group, _, version = api.rpartition("/")
    file = f"{str(obj.get('kind', '')).lower()}-{group.split('.')[0] + '-' if group else ''}{version}.json"
    validator = _built_in_validator(kube_version, file)
    if validator is None:
        return [("apiVersion", f"Kubernetes {kube_version} has no {obj.get('kind')} in {api}")]
    return [(dotted(e.absolute_path), e.message) for e in validator.iter_errors(dict(obj))]


@cache
def _built_in_validator(kube_version: str, file: str) -> Any:
    schema = _schema_file(kube_version, file)
    return None if schema is None else jsonschema.Draft202012Validator(schema, registry=_registry(kube_version))


def _unit_findings(stack: str, unit: Unit, crds: _Crds, kube_version: str) -> list[Finding]:
    for index in sorted(unit.crd_folder):
        crds.add(unit.objects[index])
    found = []
    message = "is installed before this unit" if unit.after is None else "is installed by a unit this one waits for"
    for obj in unit.objects:
        name = object_name(obj, unit.namespace)
        if is_built_in(obj):
            problems = built_in_findings(obj, kube_version)
        else:
            key = (group_of(str(obj.get("apiVersion", ""))), str(obj.get("kind", "")))
            crd = crds.known.get(key)
            problems = ([("kind", f"no CRD for {key[1]}.{key[0]} {message}")] if crd is None
                        else custom_findings(obj, crd))
        found += [Finding(stack, unit.name, name, where, problem) for where, problem in problems]
    return found


def check_stack(stack: str, units: Sequence[Unit], kube_version: str) -> list[Finding]:
    """Every finding of the module docstring for one stack's units in install order."""
    found: list[Finding] = []
    owners = {object_name({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": u.creates_namespace}}, ""):
              f"{u.name} (createNamespace)" for u in units if u.creates_namespace}
    for position, unit in enumerate(units):
        crds = _Crds()
        for earlier in units[:position]:
            if unit.after is None or earlier.name in unit.after:
                for crd in (o for o in earlier.objects if o.get("kind") == CRD_KIND):
                    crds.add(crd)
        found += _unit_findings(stack, unit, crds, kube_version)
        for obj in unit.objects:
            name = object_name(obj, unit.namespace)
            if name in owners and owners[name] != unit.name:
                found.append(Finding(stack, unit.name, name, "", f"also created by {owners[name]}"))
            owners.setdefault(name, unit.name)
    return found
