"""``ftstack plan --manifests DIR`` writes what each Helm release of a stack would create: one file per release, in
the order the program installs them, each the real Helm's render of the release as the program passes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.commands.cli import main as ftstack
from infra.config import load_stack_config
from infra.program.mocks import run_under_mocks
from infra.soperator import helm_render

REPO = Path(__file__).resolve().parents[1]
MIRROR = helm_render.mirror_beside(REPO)


def test_each_release_is_written_in_install_order(tmp_path, monkeypatch, capsys) -> None:
    assert MIRROR is not None, "no chart mirror: ../shared/upstream/charts or FT_CHART_MIRROR"
    monkeypatch.setenv(helm_render.MIRROR_ENV, str(MIRROR))
    assert ftstack(["plan", "--stack", "dev", "--manifests", str(tmp_path / "manifests")]) == 0
    out = capsys.readouterr().out
    run = run_under_mocks(load_stack_config("dev"), {"pipelineSshPrivateKey": "key"})
    recorded = {r.name: r for r in run.of_type(helm_render.RELEASE_TYPE)}
    files = sorted((tmp_path / "manifests").iterdir())
    releases = [f.name.split("-", 1)[1].removesuffix(".yaml") for f in files]
    assert [f.name[:2] for f in files] == [f"{n:02d}" for n in range(1, len(recorded) + 1)]
    assert sorted(releases) == sorted(r.inputs["name"] for r in recorded.values())
    position = {name: index for index, name in enumerate(releases)}
    for release in recorded.values():  # each file after those of every release it waits for
        waits = [run.by_urn(u).inputs["name"] for u in release.dependencies if run.by_urn(u).type == release.type]
        assert all(position[w] < position[release.inputs["name"]] for w in waits), release.inputs["name"]
    assert f"manifests: {len(releases)} releases rendered, in install order:" in out
    nodesets = helm_render.documents((tmp_path / "manifests" / f"{releases.index('nodesets') + 1:02d}-nodesets.yaml")
                                     .read_text())
    names = {(obj["kind"], obj["metadata"]["name"]) for _, obj in nodesets}
    assert {("NodeSet", "worker"), ("NodeSet", "housekeeping")} <= names
    crds = (tmp_path / "manifests" / f"{releases.index('soperator-crds') + 1:02d}-soperator-crds.yaml").read_text()
    assert crds.startswith(f"# release soperator-crds: chart {MIRROR}/helm-soperator-crds-4.1.7.tgz 4.1.7")
    assert "kind: CustomResourceDefinition" in crds


def test_a_stack_without_releases_is_refused(tmp_path, capsys) -> None:
    assert ftstack(["plan", "--stack", "local", "--manifests", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == ("ftstack plan: stack local: no Helm release to render (a nebius stack "
                                               "has them)")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("stack", ["dev"])
def test_an_unreachable_chart_names_it_and_its_source(stack, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv(helm_render.MIRROR_ENV, str(tmp_path))
    assert ftstack(["plan", "--stack", stack, "--manifests", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"chart cert-manager v1.19.1: no cert-manager-v1.19.1.tgz in the chart mirror {tmp_path}" in err
