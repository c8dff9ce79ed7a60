"""``ftstack plan --manifests DIR``: what each Helm release of the stack would create, for the change review a
platform team does before ``pulumi up``. The releases are the ones the program passes to pulumi-kubernetes under the
mocks (chart, version, namespace, values over the deletion documents, skipCrds), rendered by the real Helm
(infra/soperator/helm_render.py) in install order, each seeing the CRDs installed before it; one file per release,
``NN-<release>.yaml``, written beside DIR's other files and renamed into place. Charts come from the stack's chart
mirror (``soperator.chartMirror`` or FT_CHART_MIRROR) where set, else from each release's repository."""

from __future__ import annotations

import argparse
from pathlib import Path

from documents.atomic import atomic_file
from infra.config import StackConfig
from infra.program.mocks import MockRun
from infra.soperator import helm_render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--manifests", type=Path, metavar="DIR",
                        help="write each Helm release's rendered manifests to DIR, one file per release in install "
                             "order (real Helm; charts from the chart mirror or the repositories)")


def write_manifests(cfg: StackConfig, run: MockRun, directory: Path) -> list[Path]:
    """Render every release of ``run`` and write ``directory/NN-<release>.yaml`` in install order."""
    releases = helm_render.releases_in(run.resources)
    if not releases or cfg.nebius is None:
        raise helm_render.HelmRenderError(f"stack {cfg.stack}: no Helm release to render (a nebius stack has them)")
    # the program already resolved the chart mirror: each chart is the mirror's package or the repository's chart
    rendered = helm_render.render_stack(releases, mirror=None, kube_version=helm_render.kube_version(
        cfg.nebius.k8s_version), after=helm_render.depends_on(run.resources))
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for number, done in enumerate(rendered, start=1):
        release = done.release
        target = directory / f"{number:02d}-{release.name}.yaml"
        header = (f"# release {release.name}: chart {release.chart} {release.version}"
                  f"{f' from {release.repo}' if release.repo else ''}, namespace {release.namespace}"
                  f"{', CRDs skipped' if release.skip_crds else ''}\n")
        with atomic_file(target) as partial:
            partial.write_text(header + done.manifest)
        written.append(target)
    return written


def manifests_text(paths: list[Path]) -> str:
    return "\n".join([f"manifests: {len(paths)} releases rendered, in install order:", *(f"  {p}" for p in paths)])
