"""Every release of every cloud stack rendered with the real Helm (v3.17.3 from the lock's wheel) exactly as the program
passes it under the mocks (chart, version, namespace, values over the deletion ``value_yaml_files``, skipCrds), from
the pinned chart packages in ../shared/upstream/charts (or FT_CHART_MIRROR); each stack's objects are checked in
install order as the API server would take them (infra/soperator/manifest_checks.py)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from upstream_files import upstream_file

from infra.config import load_stack_config
from infra.nebius import backups
from infra.program.mocks import SECRET, MockRun, run_under_mocks
from infra.soperator import helm_render, manifest_checks
from infra.soperator.helm_render import HelmRelease, HelmRenderError, Rendered
from infra.soperator.manifest_checks import Unit
from infra.soperator.unread_values import unread_values

REPO = Path(__file__).resolve().parents[1]
CLOUD_STACKS = ("demo", "dev", "h100")
MIRROR = helm_render.mirror_beside(REPO)
"""FT_CHART_MIRROR, else ../shared/upstream/charts; None pulls each chart from its repository."""
CONFIG_FILE = "kubernetes:yaml/v2:ConfigFile"
DYNAMIC = "pulumi-python:dynamic:Resource"
K8S_OBJECTS = ("kubernetes:core/v1:Secret", "kubernetes:storage.k8s.io/v1:StorageClass")


def kube_version(stack: str) -> str:
    cfg = load_stack_config(stack)
    assert cfg.nebius is not None
    return helm_render.kube_version(cfg.nebius.k8s_version)


def k8up_crds(run: MockRun, config_file: Any) -> tuple[dict[str, Any], ...]:
    """The CRDs a ConfigFile of k8up's release asset applies: the pinned upstream file, once its sha256 is the one
    the program's digest check (the ConfigFile's dependency) holds the download to."""
    (digest,) = [run.by_urn(urn) for urn in config_file.dependencies if run.by_urn(urn).type == DYNAMIC]
    assert digest.inputs["url"] == config_file.inputs["file"]
    version = config_file.inputs["file"].split("/download/k8up-")[1].split("/")[0]
    assert config_file.inputs["file"] == backups.k8up_crds_url(version)
    assert crds_sha256(version) == digest.inputs["sha256"], "the pinned sha256 is not the asset's"
    return crds_objects(version)


@cache
def crds_sha256(version: str) -> str:
    return hashlib.sha256(k8up_crds_file(version).read_bytes()).hexdigest()


@cache
def crds_objects(version: str) -> tuple[dict[str, Any], ...]:
    return tuple(obj for _, obj in helm_render.documents(k8up_crds_file(version).read_text()))


def k8up_crds_file(version: str) -> Path:
    """The pinned k8up-crd.yaml of ``version`` (tests/upstream_files.py: ../shared/upstream, or FT_UPSTREAM)."""
    return upstream_file(f"crds/k8up-{version}.yaml")


def plain(inputs: dict[str, Any]) -> dict[str, Any]:
    """A recorded Kubernetes resource's inputs as the object it creates (a Secret's data, which the mocks record as
    ``[secret]``, left out)."""
    return {k: v for k, v in inputs.items() if not k.startswith("__") and v != SECRET}


API_VERSIONS: dict[tuple[str, str], tuple[str, ...]] = {}
"""(stack, unit) -> the API versions its release rendered with."""


def unit_name(resource: Any) -> str:
    return f"release {resource.inputs['name']}" if resource.type == helm_render.RELEASE_TYPE else f"resource {resource.name}"


def install_units(stack: str, run: MockRun) -> list[tuple[Unit, Rendered | None]]:
    """The stack's releases rendered in install order, each seeing the CRDs of the units it waits for, with the
    program's other Kubernetes objects (k8up's CRDs among them)."""
    kinds = (helm_render.RELEASE_TYPE, CONFIG_FILE, *K8S_OBJECTS)
    ordered = [r for r in helm_render.install_order(run.resources) if r.type in kinds]
    names = {r.name: unit_name(r) for r in ordered}
    waits = helm_render.depends_on(run.resources)
    units: list[tuple[Unit, Rendered | None]] = []
    served: dict[str, list[str]] = {}
    for resource in ordered:
        after = frozenset(names[n] for n in waits[resource.name] if n in names)
        if resource.type == helm_render.RELEASE_TYPE:
            release = HelmRelease.from_inputs(resource.inputs)
            API_VERSIONS[(stack, unit_name(resource))] = tuple(v for n in after for v in served.get(n, []))
            done = helm_render.render(release, mirror=MIRROR, kube_version=kube_version(stack),
                                      api_versions=API_VERSIONS[(stack, unit_name(resource))])
            created = release.namespace if resource.inputs.get("createNamespace") else None
            unit = Unit(unit_name(resource), release.namespace, done.objects, done.crd_folder(), after, created)
            served[unit_name(resource)] = done.api_versions()
        else:
            objects = k8up_crds(run, resource) if resource.type == CONFIG_FILE else (plain(resource.inputs),)
            served[unit_name(resource)] = helm_render.served_api_versions(objects)
            unit, done = Unit(unit_name(resource), "default", objects, after=after), None
        units.append((unit, done))
    return units


@pytest.fixture(scope="module")
def runs() -> dict[str, MockRun]:
    return {stack: run_under_mocks(load_stack_config(stack), {"pipelineSshPrivateKey": "key"}) for stack in CLOUD_STACKS}


@pytest.fixture(scope="module")
def units(runs) -> dict[str, list[tuple[Unit, Rendered | None]]]:
    return {stack: install_units(stack, run) for stack, run in runs.items()}


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_release_renders_and_the_api_server_takes_every_object(stack, units) -> None:
    found = manifest_checks.check_stack(stack, [unit for unit, _ in units[stack]], kube_version(stack))
    assert [str(f) for f in found] == []
    rendered = [done for _, done in units[stack] if done is not None]
    assert {"slurm-cluster", "nodesets", "soperator"} <= {d.release.name for d in rendered}
    assert all(d.objects for d in rendered)


@pytest.mark.parametrize("stack", ["demo", "h100"])
def test_k8ups_crds_are_installed_before_the_backup_schedule(stack, runs, units) -> None:
    """k8up's chart 4.8.3 ships no CRDs; helm-soperator-backup-config renders a k8up.io/v1 Schedule."""
    names = [unit.name for unit, _ in units[stack]]
    crds = next(i for i, n in enumerate(names) if n.endswith("-k8up-crds"))
    assert crds < names.index("release k8up") < names.index("release soperator-backup-config")
    assert names[crds] in units[stack][names.index("release soperator-backup-config")][0].after
    schedule = [o for o in units[stack][names.index("release soperator-backup-config")][0].objects
                if o["kind"] == "Schedule"]
    assert schedule and schedule[0]["apiVersion"] == "k8up.io/v1"
    k8up = next(r for r in runs[stack].of_type(helm_render.RELEASE_TYPE) if r.inputs["name"] == "k8up")
    assert any(runs[stack].by_urn(urn).type == CONFIG_FILE for urn in k8up.dependencies)


def _demo_units(units, release: str, change) -> list[str]:
    """demo's findings after ``change`` edits one rendered object of ``release`` (a copy)."""
    changed = []
    for unit, _ in units["demo"]:
        if unit.name == f"release {release}":
            objects = copy.deepcopy(list(unit.objects))
            change(objects)
            unit = Unit(unit.name, unit.namespace, tuple(objects), unit.crd_folder, unit.after)
        changed.append(unit)
    return [str(f) for f in manifest_checks.check_stack("demo", changed, kube_version("demo"))]


def _cr(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind)


def test_a_misspelled_key_a_wrong_type_and_an_uninstalled_crd_are_each_reported(units) -> None:
    misspelled = _demo_units(units, "slurm-cluster", lambda o: _cr(o, "SlurmCluster")["spec"].update(
        slurmNodez={"a": 1}))
    assert misspelled == ["demo: release slurm-cluster: slurm.nebius.ai/v1 SlurmCluster soperator/soperator: "
                          "spec.slurmNodez: pruned: not in the CRD's schema"]
    wrong_type = _demo_units(units, "nodesets", lambda o: _cr(o, "NodeSet")["spec"].update(replicas="five"))
    assert len(wrong_type) == 1 and wrong_type[0].startswith("demo: release nodesets: slurm.nebius.ai/v1alpha1 NodeSet")
    assert wrong_type[0].endswith("spec.replicas: 'five' is not of type 'integer'")
    uninstalled = _demo_units(units, "nodesets", lambda o: o.append(
        {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}))
    assert uninstalled == ["demo: release nodesets: example.com/v1 Widget soperator/w: kind: no CRD for "
                           "Widget.example.com is installed by a unit this one waits for"]
    built_in = _demo_units(units, "nodesets", lambda o: _cr(o, "PriorityClass").update(valu=1))
    assert len(built_in) == 1 and "PriorityClass" in built_in[0] and "'valu' was unexpected" in built_in[0]


def test_a_schedule_without_k8ups_crds_is_reported(units) -> None:
    without = [unit for unit, _ in units["demo"] if not unit.name.endswith("-k8up-crds")]
    found = [str(f) for f in manifest_checks.check_stack("demo", without, kube_version("demo"))]
    assert found == ["demo: release soperator-backup-config: k8up.io/v1 Schedule soperator/soperator-jail: kind: "
                     "no CRD for Schedule.k8up.io is installed by a unit this one waits for"]


def test_an_object_two_releases_render_is_reported(units) -> None:
    twice = [unit for unit, _ in units["demo"]]
    twice.append(next(u for u in twice if u.name == "release nodesets"))
    twice[-1] = Unit("release nodesets-again", twice[-1].namespace, twice[-1].objects, after=twice[-1].after)
    found = [str(f) for f in manifest_checks.check_stack("demo", twice, kube_version("demo"))]
    assert found and all(f.startswith("demo: release nodesets-again: ") and f.endswith("also created by release "
                                                                                      "nodesets") for f in found)


def test_a_chart_rendering_the_namespace_its_release_creates_is_reported(units) -> None:
    """kruise 1.8.0 renders Namespace kruise-system unless installation.createNamespace is false, and the release
    creates it already (createNamespace): Helm would refuse to take the existing namespace into the release."""
    (kruise,) = [(u, d) for u, d in units["demo"] if u.name == "release kruise"]
    values = copy.deepcopy(dict(kruise[1].release.values))
    values["installation"]["createNamespace"] = True
    done = helm_render.render(dataclasses.replace(kruise[1].release, values=values), mirror=MIRROR,
                              kube_version=kube_version("demo"))
    changed = [dataclasses.replace(u, objects=done.objects) if u.name == "release kruise" else u
               for u, _ in units["demo"]]
    found = [str(f) for f in manifest_checks.check_stack("demo", changed, kube_version("demo"))]
    assert found == ["demo: release kruise: v1 Namespace kruise-system: (object): also created by release kruise "
                     "(createNamespace)"]


def test_a_missing_chart_names_the_chart_and_its_source(tmp_path) -> None:
    release = HelmRelease("k8up", "k8up", "4.8.3", "k8up-system", {}, repo="https://k8up-io.github.io/k8up")
    with pytest.raises(HelmRenderError, match=rf"^chart k8up 4\.8\.3: no k8up-4\.8\.3\.tgz in the chart mirror {tmp_path}$"):
        helm_render.render(release, mirror=tmp_path, kube_version="1.36.0")


def test_a_chart_mirror_is_what_every_release_installs_from(tmp_path, monkeypatch) -> None:
    """FT_CHART_MIRROR (or the stack's soperator.chartMirror) replaces every release's repository by its package;
    a package the mirror lacks stops the program naming the chart and the mirror."""
    assert MIRROR is not None
    monkeypatch.setenv(helm_render.MIRROR_ENV, str(MIRROR))
    run = run_under_mocks(load_stack_config("dev"), {"pipelineSshPrivateKey": "key"})
    releases = [release for _, release in helm_render.releases_in(run.resources)]
    assert releases and all(Path(r.chart).parent == MIRROR and r.repo is None for r in releases)
    nodesets = next(r for r in releases if r.name == "nodesets")
    assert nodesets.chart == str(MIRROR / "helm-nodesets-4.1.7.tgz")
    done = helm_render.render(nodesets, mirror=None, kube_version=kube_version("dev"))
    assert {o["kind"] for o in done.objects} == {"NodeSet", "PriorityClass"}
    cfg = load_stack_config("dev")
    assert cfg.soperator is not None
    empty = cfg.model_copy(update={"soperator": cfg.soperator.model_copy(update={"chart_mirror": str(tmp_path)})})
    with pytest.raises(Exception, match=rf"chart cert-manager v1\.19\.1: no cert-manager-v1\.19\.1\.tgz in the chart "
                                        rf"mirror {tmp_path}"):
        run_under_mocks(empty, {"pipelineSshPrivateKey": "key"})


@cache
def unread(release: HelmRelease, kube: str, api_versions: tuple[str, ...]) -> tuple[str, ...]:
    """A release's unread values, once per release and inputs (the stacks share most releases)."""
    return tuple(unread_values(release, mirror=MIRROR, kube_version=kube, api_versions=api_versions))


SLOW_TO_RENDER = frozenset({"release metrics"})
"""victoria-metrics-k8s-stack with its subcharts takes seconds a render: its values are asked apart (marked slow)."""


def stack_unread(stack: str, units, names: Any) -> list[str]:
    return [f"{stack}: {unit.name}: {path}" for unit, done in units[stack] if done is not None and names(unit.name)
            for path in unread(done.release, kube_version(stack), API_VERSIONS[(stack, unit.name)])]


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_value_the_program_sends_is_read_by_its_chart(stack, units) -> None:
    """What the hand-written chart contracts caught and a render alone does not: a value Helm passes silently."""
    assert stack_unread(stack, units, lambda name: name not in SLOW_TO_RENDER) == []


@pytest.mark.slow
def test_every_value_the_monitoring_stack_gets_is_read(units) -> None:
    """The same for the VictoriaMetrics release of every stack that installs it (its values are the same on each
    stack with the default monitoring settings, so one sweep serves them)."""
    assert [f for stack in CLOUD_STACKS for f in stack_unread(stack, units, SLOW_TO_RENDER.__contains__)] == []


def test_an_unread_key_is_reported(units) -> None:
    """helm-soperator-backup-config 4.1.7 reads scheduleName and backup.schedule; misspelled, neither is read (and
    the chart's defaults render instead), while every value the program sends still is."""
    (done,) = [d for u, d in units["demo"] if u.name == "release soperator-backup-config"]
    values = copy.deepcopy(dict(done.release.values))
    values["scheduleNmae"] = values.pop("scheduleName")
    values["backup"]["schedulee"] = "0 3 * * *"
    typo = dataclasses.replace(done.release, values=values)
    found = unread_values(typo, mirror=MIRROR, kube_version=kube_version("demo"))
    assert found == ["backup.schedulee", "scheduleNmae"]


def test_the_k8up_crds_download_is_refused_unless_its_sha256_is_the_pinned_one(tmp_path) -> None:
    """The digest check the k8up CRDs' ConfigFile waits for (infra/nebius/backups.py), run on the pinned upstream
    file by URL: its own sha256 passes, one changed byte fails naming both digests; an unpinned version is refused."""
    crds = k8up_crds_file("4.8.3")
    pinned = backups.k8up_crds_sha256("4.8.3")
    props = {"url": crds.as_uri(), "sha256": pinned}
    assert backups._DigestProvider().create(props).id == pinned
    tampered = tmp_path / "k8up-crd.yaml"
    tampered.write_bytes(crds.read_bytes() + b"\n")
    with pytest.raises(ValueError, match=rf"k8up-crd\.yaml: sha256 [0-9a-f]{{64}}, pinned {pinned}$"):
        backups._DigestProvider().create({"url": tampered.as_uri(), "sha256": pinned})
    with pytest.raises(ValueError, match=r"soperator\.k8upVersion 9\.9\.9: .* known for 4\.8\.3"):
        backups.k8up_crds_sha256("9.9.9")
