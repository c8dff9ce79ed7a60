"""Soperator's active checks on the cloud stacks: both releases, what the 4.1.7 chart reads and refuses to render,
what each scope runs after creation, `off`, and their one-off cost line. Expected values are read from
nebius/soperator 4.1.7 (helm/soperator-activechecks/values.yaml and scripts/*.sh) and the solutions library's
five-scope locals_active_checks.tf."""

from __future__ import annotations

import copy
import dataclasses
import tarfile
from pathlib import Path

import pytest

from infra.config import StackConfig, load_stack_config
from infra.cost.tco import ONE_OFF, monthly_cost
from planning.prices import PriceBook, node_price
from infra.nebius.layout import layout
from infra.soperator.active_checks import (
    CHECKS_RELEASE,
    CONTROLLER_CHART,
    HARD_CODED,
    after_creation,
    literal_names,
    name_conflicts,
)
from infra.soperator import helm_render
from infra.soperator.helm_render import HelmRelease, HelmRenderError
from infra.soperator.unread_values import unread_values
from infra.soperator.values import SOPERATOR_NAMESPACE, release_plan

MIRROR = helm_render.mirror_beside(Path(__file__).resolve().parents[1])
SIZES = {"jail": 256, "controller-spool": 128, "accounting": 256}
# values.yaml 4.1.7: checks with runAfterCreation true that are GPU Slurm jobs, and their scripts' #SBATCH --time
GPU_AFTER_CREATION_MIN = {"all-reduce-perf-nccl-in-docker": 10, "all-reduce-perf-nccl-with-ib": 30,
                          "all-reduce-perf-nccl-without-ib": 20, "cuda-samples": 10, "gpu-fryer": 20,
                          "ib-gpu-perf": 20, "mem-perf": 15}
PREPULL_MIN = 30  # prepull-container-image: one exclusive job (no eachWorkerJobs)


def with_scope(stack: str, scope: str) -> StackConfig:
    cfg = load_stack_config(stack)
    assert cfg.soperator
    checks = cfg.soperator.active_checks.model_copy(update={"scope": scope})
    return cfg.model_copy(update={"soperator": cfg.soperator.model_copy(update={"active_checks": checks})})


def releases(cfg: StackConfig) -> dict:
    specs = layout(cfg)
    sizes = SIZES | {fs.mount_tag: fs.size_gib for fs in specs.filesystems}
    return {r.key: r for r in release_plan(cfg, list(specs.node_groups), "alloc", sizes)}


@pytest.mark.parametrize(("stack", "gpus"), [("demo", "2"), ("h100", "8"), ("dev", "1")])
def test_both_releases_as_the_reference_installs_them(stack, gpus) -> None:
    cfg = load_stack_config(stack)
    plan = releases(cfg)
    controller, checks = plan[CONTROLLER_CHART], plan[CHECKS_RELEASE]
    assert controller.name == "soperator-checks"  # soperator-fluxcd 4.1.7: soperator.soperatorChecks.releaseName
    assert controller.chart == "oci://cr.eu-north1.nebius.cloud/soperator/helm-soperatorchecks"
    assert checks.chart == "oci://cr.eu-north1.nebius.cloud/soperator/helm-soperator-activechecks"
    # the chart's scripts and CronJob reach the cluster `soperator` in namespace `soperator` (see below)
    assert (controller.namespace, checks.namespace) == (SOPERATOR_NAMESPACE, "soperator")
    assert set(checks.depends_on) == {"slurm-cluster-storage", "slurm-cluster", "nodesets", CONTROLLER_CHART}
    assert controller.depends_on == ("soperator",)
    assert checks.timeout_s == 120 * 60  # soperator-fluxcd 4.1.7: soperatorActiveChecks.timeout 120m
    assert controller.values["checks"]["manager"]["enableNodeReplacement"] is True  # the reference turns it on
    assert checks.values["slurmClusterRefName"] == plan["slurm-cluster"].values["clusterName"] == "soperator"
    assert checks.values["slurmJob"]["gpusPerNode"] == gpus
    assert checks.values["cudaVersion"] == plan["slurm-cluster"].values["cudaVersion"] == "13.0.2"
    assert checks.values["checks"]["ssh-check"]["k8sJobSpec"]["jobContainer"]["env"] == [
        {"name": "NUM_OF_LOGIN_NODES", "value": "1"}]


def test_the_scope_changes_what_runs_after_creation() -> None:
    dev, quick, essential = (releases(with_scope("h100", s))[CHECKS_RELEASE].helm_document()["checks"]
                             for s in ("dev", "prod_quick", "essential"))
    assert "all-reduce-perf-nccl-in-docker" not in dev
    assert dev["ib-gpu-perf"]["failureReactions"] == {
        "drainSlurmNode": {"drainReasonPrefix": "[node_problem]"}, "commentSlurmNode": None}
    assert quick["all-reduce-perf-nccl-in-docker"] == {"runAfterCreation": False}
    assert "ib-gpu-perf" not in quick  # the chart's own reaction: a comment with [node_problem]
    not_after = {name for name, v in essential.items() if v.get("runAfterCreation") is False}
    assert not_after == {"all-reduce-perf-nccl-in-docker", "all-reduce-perf-nccl-with-ib",
                         "all-reduce-perf-nccl-without-ib", "cuda-samples", "gpu-fryer", "mem-perf",
                         "prepull-container-image", "manage-jail-state", "ib-gpu-perf"}
    ran = {s: {c.name for c in after_creation(with_scope("h100", s))} for s in ("dev", "prod_quick", "essential")}
    assert set(GPU_AFTER_CREATION_MIN) <= ran["dev"]
    assert ran["dev"] - ran["prod_quick"] == {"all-reduce-perf-nccl-in-docker"}
    assert not set(GPU_AFTER_CREATION_MIN) & ran["essential"] and "ssh-check" in ran["essential"]


def test_infiniband_checks_stay_suspended_without_a_fabric() -> None:
    demo = releases(load_stack_config("demo"))[CHECKS_RELEASE].values["checks"]
    for name in ("all-reduce-perf-nccl-with-ib", "ib-gpu-perf"):
        assert demo[name] == {"runAfterCreation": False, "suspend": True}
    assert "all-reduce-perf-nccl-with-ib" not in releases(load_stack_config("h100"))[CHECKS_RELEASE].values["checks"]


def test_off_removes_both_releases_and_the_cost_line() -> None:
    for stack in ("demo", "h100"):
        cfg = with_scope(stack, "off")
        assert not {CONTROLLER_CHART, CHECKS_RELEASE} & set(releases(cfg))
        assert not [line for line in monthly_cost(cfg).lines if line.category == ONE_OFF]


def test_the_chart_reads_no_cluster_name_and_refuses_a_comment_beside_a_drain() -> None:
    """helm/soperator-activechecks 4.1.7 takes the cluster from slurmClusterRefName, and _helpers.tpl's
    checkReactionsConflict fails the render when a check has both a comment and a drain reaction."""
    assert MIRROR is not None, "no chart mirror: ../shared/upstream/charts or FT_CHART_MIRROR"
    checks = HelmRelease.from_spec(releases(load_stack_config("h100"))[CHECKS_RELEASE])
    named = dataclasses.replace(checks, values={**checks.values, "clusterName": "x"})
    assert unread_values(named, mirror=MIRROR, kube_version="1.36.0", only=["clusterName"]) == ["clusterName"]
    both = copy.deepcopy(dict(checks.values))
    both["checks"]["ib-gpu-perf"] = {"failureReactions": {"drainSlurmNode": {"drainReasonPrefix": "[node_problem]"}}}
    with pytest.raises(HelmRenderError, match="release soperator-activechecks"):
        helm_render.render(dataclasses.replace(checks, values=both, value_documents=()), mirror=MIRROR,
                           kube_version="1.36.0")


def test_another_soperator_version_needs_scope_off() -> None:
    cfg = load_stack_config("demo")
    assert cfg.soperator
    v5 = cfg.model_copy(update={"soperator": cfg.soperator.model_copy(update={"version": "5.0.0"})})
    with pytest.raises(ValueError, match="described for Soperator 4.1.7 only, not 5.0.0; set soperator.activeChecks.scope: off"):
        releases(v5)


@pytest.mark.parametrize(("stack", "scope", "each_min", "fabric"), [
    ("demo", "prod_quick", 20 + 10 + 20 + 15, False),
    ("h100", "prod_quick", 30 + 20 + 10 + 20 + 20 + 15, True),
    ("h100", "dev", 10 + 30 + 20 + 10 + 20 + 20 + 15, True),
])
def test_the_checks_gpu_time_after_creation_is_a_one_off_line(stack, scope, each_min, fabric) -> None:
    cfg = with_scope(stack, scope)
    assert cfg.nodes
    worker = cfg.nodes.workers[0]
    assert bool(worker.fabric) == fabric
    node_hours = each_min / 60 * worker.size + PREPULL_MIN / 60
    cost = monthly_cost(cfg)
    [line] = [line for line in cost.lines if line.category == ONE_OFF]
    hourly = node_price(worker.platform, worker.preset, PriceBook()).usd_per_hour
    assert line.usd_high == pytest.approx(node_hours * hourly)
    assert line.quantity == f"{node_hours:.2f} node-hours ({node_hours * worker.shape.gpus:.2f} GPU-hours)"
    off = monthly_cost(with_scope(stack, "off"))
    assert (cost.usd_low, cost.usd_high) == (off.usd_low, off.usd_high)


def test_the_pinned_chart_hard_codes_the_cluster_and_namespace_soperator() -> None:
    """Read from the chart's own lines (active_checks.HARD_CODED, each found verbatim at its line in the pinned
    package): the login FQDN of scripts/create-user.sh and ssh-check.sh, and the CronJob template's ConfigMap, Secret,
    label and namespaces."""
    assert MIRROR is not None, "no chart mirror: ../shared/upstream/charts or FT_CHART_MIRROR"
    with tarfile.open(MIRROR / "helm-soperator-activechecks-4.1.7.tgz") as package:
        for line in HARD_CODED["4.1.7"]:
            member = package.extractfile(f"helm-soperator-activechecks/{line.file}")
            assert member is not None, line.file
            assert member.read().decode().splitlines()[line.line - 1] == line.text, f"{line.file}:{line.line}"
    names = literal_names("4.1.7")
    by_file = {(n.where.rsplit(":", 1)[0], n.kind, n.name) for n in names}
    assert {("helm/soperator-activechecks/scripts/create-user.sh", "cluster", "soperator"),
            ("helm/soperator-activechecks/scripts/create-user.sh", "namespace", "soperator"),
            ("helm/soperator-activechecks/scripts/ssh-check.sh", "namespace", "soperator"),
            ("helm/soperator-activechecks/templates/run-extensive-check-on-reservations.yaml", "namespace", "soperator"),
            } <= by_file
    assert {(n.kind, n.name) for n in names} == {("cluster", "soperator"), ("namespace", "soperator")}
    assert literal_names("5.0.0") == names  # 5.0.0 (main at c238d993) keeps the same lines


@pytest.mark.parametrize("stack", ["demo", "h100", "dev"])
def test_every_stack_names_its_cluster_and_namespace_as_the_chart_does(stack) -> None:
    cfg = load_stack_config(stack)
    plan = releases(cfg)
    chart = {(n.kind, n.name) for n in literal_names("4.1.7")}
    ours = {("cluster", plan["slurm-cluster"].values["clusterName"]), ("cluster", plan[CHECKS_RELEASE].values["slurmClusterRefName"]),
            *(("namespace", plan[key].namespace) for key in ("slurm-cluster-storage", "slurm-cluster", "nodesets", CHECKS_RELEASE))}
    assert ours == chart
    assert name_conflicts(cfg) == []


def test_a_stack_naming_its_cluster_otherwise_is_refused_unless_the_checks_are_off() -> None:
    cfg = load_stack_config("demo")
    assert cfg.soperator
    renamed = cfg.model_copy(update={"soperator": cfg.soperator.model_copy(
        update={"slurm_cluster_name": "innovationbank", "namespace": "ib"})})
    with pytest.raises(ValueError) as refused:
        releases(renamed)
    message = str(refused.value)
    assert ("soperator.slurmClusterName is 'innovationbank', but Soperator 4.1.7's active checks reach the cluster "
            "'soperator' (helm/soperator-activechecks/scripts/create-user.sh:7)") in message
    assert "soperator.namespace is 'ib'" in message and "run-extensive-check-on-reservations.yaml:131" in message
    off = with_scope("demo", "off")
    assert off.soperator
    off = off.model_copy(update={"soperator": off.soperator.model_copy(update={"slurm_cluster_name": "innovationbank"})})
    plan = releases(off)
    assert CHECKS_RELEASE not in plan and plan["slurm-cluster"].values["clusterName"] == "innovationbank"
