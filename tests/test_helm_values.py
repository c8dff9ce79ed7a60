"""What each Helm release really receives. Pulumi's Python SDK drops None from a Release's ``values`` (pulumi/pulumi
#12178), so the program's releases are run under mocks and read back as the engine gets them: ``values`` merged onto
the ``value_yaml_files`` documents (pulumi-kubernetes: values take precedence). Every value and every deletion the
program means must be there; the two deletions are the ones Soperator 4.1.7's charts need."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra.config import load_stack_config
from infra.nebius.layout import layout
from infra.program.mocks import run_under_mocks
from infra.soperator import helm_values
from infra.soperator.values import BackupTarget, ReleaseSpec, release_plan

RELEASE = "kubernetes:helm.sh/v3:Release"
CLOUD_STACKS = ["demo", "dev", "h100"]
SPOOL_CLAIM = ("slurmNodes", "controller", "volumes", "spool", "volumeClaimTemplateSpec")
IB_COMMENT = ("checks", "ib-gpu-perf", "failureReactions", "commentSlurmNode")


def received(inputs: dict[str, Any]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for asset in inputs.get("valueYamlFiles") or []:
        document = helm_values.merged(document, yaml.safe_load(asset["text"]) or {})
    return helm_values.merged(document, inputs.get("values") or {})


def lost(meant: Any, got: Any, path: tuple[str, ...] = ()) -> list[str]:
    """Paths of ``meant`` missing from ``got``, and nulls that arrive as anything but null."""
    if isinstance(meant, dict):
        if not isinstance(got, dict):
            return [".".join(path)]
        return [p for k, v in meant.items()
                for p in (lost(v, got[k], (*path, k)) if k in got else [".".join((*path, k))])]
    if isinstance(meant, list):
        if not isinstance(got, list) or len(got) != len(meant):
            return [".".join(path)]
        return [p for i, (m, g) in enumerate(zip(meant, got)) for p in lost(m, g, (*path, f"[{i}]"))]
    return [".".join(path)] if (meant is None) != (got is None) else []


def at(document: dict[str, Any], path: tuple[str, ...]) -> Any:
    for segment in path:
        document = document[segment]
    return document


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    return {stack: run_under_mocks(load_stack_config(stack), {"pipelineSshPrivateKey": "key"}) for stack in CLOUD_STACKS}


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_every_release_receives_every_value_and_deletion_it_means(stack, runs) -> None:
    cfg = load_stack_config(stack)
    specs = layout(cfg)
    sizes = {fs.mount_tag: fs.size_gib for fs in specs.filesystems}
    backup = BackupTarget("bucket", "endpoint") if cfg.buckets and cfg.buckets.backups.enabled else None
    meant = {spec.name: spec for spec in release_plan(cfg, list(specs.node_groups), "alloc", sizes, backup)}
    got = {r.inputs["name"]: received(r.inputs) for r in runs[stack].of_type(RELEASE)}
    assert set(got) == set(meant)
    for key, document in got.items():
        assert lost(meant[key].helm_document(), document) == [], key
        assert helm_values.null_paths(meant[key].values) == []


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_the_controller_spool_has_one_source_as_the_crd_requires(stack, runs) -> None:
    """helm/slurm-cluster 4.1.7 passes ``slurmNodes.controller.volumes.spool`` through toYaml into the SlurmCluster's
    NodeVolume, which takes one source; its values.yaml defaults ``volumeClaimTemplateSpec`` to a 50Gi claim."""
    slurm_cluster = next(received(r.inputs) for r in runs[stack].of_type(RELEASE) if r.inputs["name"] == "slurm-cluster")
    spool = at(slurm_cluster, SPOOL_CLAIM[:-1])
    assert spool == {"volumeSourceName": "controller-spool", "volumeClaimTemplateSpec": None}


def test_dev_drains_on_ib_gpu_perf_without_the_charts_comment_reaction(runs) -> None:
    """helm/soperator-activechecks 4.1.7 values.yaml gives ib-gpu-perf a commentSlurmNode reaction, and _helpers.tpl's
    checkReactionsConflict fails the render when a check has both a comment and a drain."""
    checks = {stack: next(received(r.inputs) for r in runs[stack].of_type(RELEASE)
                          if r.inputs["name"] == "soperator-activechecks") for stack in CLOUD_STACKS}
    reactions = at(checks["dev"], IB_COMMENT[:-1])
    assert reactions == {"drainSlurmNode": {"drainReasonPrefix": "[node_problem]"}, "commentSlurmNode": None}
    assert "ib-gpu-perf" not in checks["h100"]["checks"]  # prod_quick on a fabric keeps the chart's comment


def test_a_none_in_values_is_refused_naming_the_release_and_path() -> None:
    with pytest.raises(ValueError, match=r"release x: None at a\.b, c\.\[1\] would never reach Helm"):
        ReleaseSpec("x", "chart", "1", "ns", {"a": {"b": None}, "c": [1, None]}, ("soperator", "x"))
    spec = ReleaseSpec("x", "chart", "1", "ns", {"a": {"c": 1}}, ("soperator", "x"), deletions=(("a", "b"),))
    assert spec.helm_document() == {"a": {"b": None, "c": 1}}
    assert yaml.safe_load(helm_values.deletion_yaml(spec.deletions)) == {"a": {"b": None}}
