"""Soperator's active checks as the reference install sets them: the checks of helm-soperator-activechecks at the
pinned Soperator version, what each ``activeChecks.scope`` runs after creation, and their GPU time.

Sources (read 2026-11-25):
- nebius/soperator at tag 4.1.7 (commit 6f7fd3a9f9abe04f7d8e39a80ad87885259d73ce): helm/soperator-activechecks/
  values.yaml (every check, ``runAfterCreation``, ``slurmJobSpec.eachWorkerJobs``, failure reactions),
  scripts/*.sh (``#SBATCH --time`` and ``--exclusive``), helm/soperatorchecks/values.yaml
  (``checks.manager.enableNodeReplacement``), helm/soperator-fluxcd/values.yaml (release namespaces, the 120m
  timeout of the activechecks release, whose post-install hook waits for the checks that run after creation).
- nebius/nebius-solutions-library soperator/modules/slurm/locals_active_checks.tf, the revision with the five
  scopes dev, testing, prod_quick, prod_acceptance and essential over 4.1.x's check names (the newest revision,
  commit 88148c4ce6aee99779fbac600504b04f60894b77, has four scopes over 5.x's ``gpu-checks``). Its per-check
  ``drainReasonPrefix``/``commentPrefix`` for ib-gpu-perf are written here as 4.1.7's ``failureReactions``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from infra.config import StackConfig
from workloads.checks.node_states import NODE_PROBLEM

CONTROLLER_CHART = "soperatorchecks"
CONTROLLER_RELEASE = "soperator-checks"
"""The controller's Helm release name, as soperator-fluxcd 4.1.7 installs it (soperator.soperatorChecks.releaseName)."""
CHECKS_RELEASE = "soperator-activechecks"
CHECKS_RELEASE_TIMEOUT_S = 7200
CHECKS_READ = ("slurm-cluster-storage", "slurm-cluster", "nodesets", CONTROLLER_CHART)
"""Releases whose objects the checks release reads: the jail PVC (run-extensive-check-on-reservations mounts
``jail-pvc``), the SlurmCluster with its login service, ConfigMap and munge Secret, the workers, the controller."""


@dataclass(frozen=True)
class Check:
    """One ActiveCheck of the chart, as its values.yaml and script define it."""

    name: str
    after_creation: bool
    """The chart's ``runAfterCreation``."""
    time_limit_min: int = 0
    """``#SBATCH --time`` of its script; 0 for Kubernetes jobs."""
    gpu_nodes: bool = False
    """A Slurm job holding whole GPU nodes (``--exclusive``, ``SBATCH_GPUS_PER_NODE``)."""
    each_worker: bool = False
    """One job per worker node (``eachWorkerJobs``); otherwise one job on one node."""
    infiniband: bool = False


CHECKS: dict[str, tuple[Check, ...]] = {
    "4.1.7": (
        Check("all-reduce-perf-nccl-in-docker", True, 10, True, True),
        Check("all-reduce-perf-nccl-with-ib", True, 30, True, True, infiniband=True),
        Check("all-reduce-perf-nccl-without-ib", True, 20, True, True),
        Check("cuda-samples", True, 10, True, True),
        Check("dcgmi-diag-r2", False, 30, True, True),
        Check("dcgmi-diag-r3", False, 120, True, True),
        Check("ensure-healthy-nodes", True, 5),
        Check("extensive-check", False, 60, True),
        Check("gpu-fryer", True, 20, True, True),
        Check("ib-gpu-perf", True, 20, True, True, infiniband=True),
        Check("mem-perf", True, 15, True, True),
        Check("prepull-container-image", True, 30, True),
        Check("enroot-cleanup", False, 60, each_worker=True),
        *(Check(name, True) for name in ("ssh-check", "create-user-soperatorchecks", "create-user-nebius",
                                         "ensure-dir-snccld-logs", "manage-jail-state", "wait-for-topology",
                                         "wait-for-soperatorchecks-srun-ready")),
        *(Check(name, False) for name in ("soperator-outputs-logs-cleaner", "manage-jail-state-force",
                                          "manage-jail-state-dry-run", "upgrade-health-checker", "retrigger-checks")),
    ),
}

_NOT_AFTER_CREATION: dict[str, tuple[str, ...]] = {
    "dev": (),
    "testing": (),
    "prod_quick": ("all-reduce-perf-nccl-in-docker",),
    "prod_acceptance": ("all-reduce-perf-nccl-in-docker",),
    "essential": ("all-reduce-perf-nccl-in-docker", "all-reduce-perf-nccl-with-ib", "all-reduce-perf-nccl-without-ib",
                  "cuda-samples", "dcgmi-diag-r2", "dcgmi-diag-r3", "gpu-fryer", "mem-perf", "prepull-container-image",
                  "manage-jail-state", "ib-gpu-perf"),
}
"""Per scope, the checks the reference stops from running after creation."""
_IB_DRAINS = ("dev", "testing")
"""Scopes where a failed ib-gpu-perf drains the node instead of commenting it (the chart default)."""


def checks(version: str) -> tuple[Check, ...]:
    try:
        return CHECKS[version]
    except KeyError:
        raise ValueError(f"soperator.activeChecks: the active checks are described for Soperator "
                         f"{', '.join(CHECKS)} only, not {version}; set soperator.activeChecks.scope: off") from None


def _fabric(cfg: StackConfig) -> bool:
    return bool(cfg.nodes and any(w.fabric for w in cfg.nodes.workers))


def after_creation(cfg: StackConfig) -> list[Check]:
    """The checks that run once the cluster is created, for the stack's scope (none with scope off). Checks that
    need InfiniBand stay suspended on stacks whose workers have no fabric."""
    sop = cfg.soperator
    if sop is None or sop.active_checks.scope == "off":
        return []
    skipped, fabric = set(_NOT_AFTER_CREATION[sop.active_checks.scope]), _fabric(cfg)
    return [c for c in checks(sop.version)
            if c.after_creation and c.name not in skipped and (fabric or not c.infiniband)]


def _gpus_per_node(cfg: StackConfig) -> int:
    """GPUs the GPU checks request per node (``slurmJob.gpusPerNode``): the smallest worker set's count."""
    assert cfg.nodes is not None
    return min(w.shape.gpus for w in cfg.nodes.workers)


def controller_values(cfg: StackConfig) -> dict[str, Any]:
    """helm-soperatorchecks: node replacement as the stack says (on by default, as the reference); its ServiceMonitor only with the
    Prometheus CRDs of the monitoring releases."""
    assert cfg.soperator is not None
    return {
        "checks": {"manager": {"enableNodeReplacement": cfg.soperator.active_checks.node_replacement}},
        "serviceMonitor": {"enabled": cfg.monitoring_on},
    }


def checks_values(cfg: StackConfig) -> dict[str, Any]:
    """helm-soperator-activechecks: the cluster they check, its CUDA version (picks the check image and NCCL
    tests), GPUs per node, and the scope's overrides of the chart's checks."""
    sop, nodes = cfg.soperator, cfg.nodes
    assert sop is not None and nodes is not None
    scope = sop.active_checks.scope
    catalog = {c.name: c for c in checks(sop.version)}
    overrides: dict[str, dict[str, Any]] = {
        name: {"runAfterCreation": False} for name in _NOT_AFTER_CREATION[scope] if catalog[name].after_creation
    }
    overrides["ssh-check"] = {"k8sJobSpec": {"jobContainer": {"env": [
        {"name": "NUM_OF_LOGIN_NODES", "value": str(nodes.login.size)}]}}}
    if scope in _IB_DRAINS:
        overrides.setdefault("ib-gpu-perf", {})["failureReactions"] = {
            "drainSlurmNode": {"drainReasonPrefix": NODE_PROBLEM}}
    if not _fabric(cfg):
        for check in catalog.values():
            if check.infiniband:
                overrides.setdefault(check.name, {}).update(runAfterCreation=False, suspend=True)
    values: dict[str, Any] = {
        "slurmClusterRefName": cfg.slurm_cluster_name,
        "slurmJob": {"gpusPerNode": str(_gpus_per_node(cfg))},
        "checks": overrides,
    }
    if cfg.cuda_version is not None:
        values["cudaVersion"] = cfg.cuda_version
    return values


NameKind = Literal["cluster", "namespace"]
_NAME = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?"
_LITERAL_NAMES: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    rf"login-0\.(?P<cluster>{_NAME})-login-headless-svc\.(?P<namespace>{_NAME})\.svc\.cluster\.local",
    rf"^\s*app\.kubernetes\.io/instance:\s*(?P<cluster>{_NAME})\s*$",
    rf"^\s*name:\s*(?P<cluster>{_NAME})-slurm-configs\s*$",
    rf"^\s*secretName:\s*(?P<cluster>{_NAME})-munge\s*$",
    rf"^\s*namespace:\s*(?P<namespace>{_NAME})\s*$",
))
"""How a literal line names the Slurm cluster or its namespace: Soperator 4.1.7's internal/naming/naming.go builds
the login headless service ``<cluster>-login-headless-svc`` (FQDN ``<svc>.<namespace>.svc.cluster.local``), the
ConfigMap ``<cluster>-slurm-configs`` and the Secret ``<cluster>-munge``; the instance label is the cluster's name."""


@dataclass(frozen=True)
class HardCodedLine:
    """A line of the activechecks chart, verbatim, that names the Slurm cluster or its namespace literally."""

    file: str
    """Path inside the chart folder, e.g. scripts/ssh-check.sh."""
    line: int
    text: str


_CRONJOB = "templates/run-extensive-check-on-reservations.yaml"
_HARD_CODED_4_1_7 = (
    HardCodedLine('scripts/create-user.sh', 7,
                  '    soperatorchecks@login-0.soperator-login-headless-svc.soperator.svc.cluster.local \\'),
    HardCodedLine('scripts/ssh-check.sh', 11,
                  '      -o "ProxyCommand=ssh -i /mnt/jail/opt/soperator-home/soperatorchecks/.ssh/soperatorc'
                  'hecks_id_ecdsa -o StrictHostKeyChecking=no -W %h:%p soperatorchecks@login-0.soperator-logi'
                  'n-headless-svc.soperator.svc.cluster.local " \\'),
    HardCodedLine(_CRONJOB, 7,
                  '    app.kubernetes.io/instance: soperator'),
    HardCodedLine(_CRONJOB, 28,
                  '            app.kubernetes.io/instance: soperator'),
    HardCodedLine(_CRONJOB, 114,
                  '              name: soperator-slurm-configs'),
    HardCodedLine(_CRONJOB, 123,
                  '              secretName: soperator-munge'),
    HardCodedLine(_CRONJOB, 131, '  namespace: soperator'),
    HardCodedLine(_CRONJOB, 137, '  namespace: soperator'),
    HardCodedLine(_CRONJOB, 159, '  namespace: soperator'),
    HardCodedLine(_CRONJOB, 167, '  namespace: soperator'),
)
HARD_CODED: dict[str, tuple[HardCodedLine, ...]] = {"4.1.7": _HARD_CODED_4_1_7, "5.0.0": _HARD_CODED_4_1_7}
"""The activechecks chart's lines with literal names per Soperator version (helm/soperator-activechecks at 4.1.7;
tests/test_active_checks.py finds each verbatim in the pinned package): the Slurm cluster ``soperator``
(login-0.<cluster>-login-headless-svc, <cluster>-slurm-configs, <cluster>-munge and the instance label, as
internal/naming/naming.go builds them) and its namespace. The scripts run in the ssh-check and create-user-* checks;
the CronJob template renders unconditionally. 5.0.0 (main at c238d993) keeps the same lines."""


@dataclass(frozen=True)
class LiteralName:
    """A name the activechecks chart hard-codes, and where."""

    kind: NameKind
    name: str
    where: str


def literal_names(version: str) -> list[LiteralName]:
    """Every cluster or namespace name hard-coded in the activechecks chart at ``version`` (``HARD_CODED``); a
    recorded line that names neither is an error in that table."""
    if version not in HARD_CODED:
        raise ValueError(f"soperator.version {version}: the activechecks chart's literal names are not recorded; known "
                         f"for {', '.join(HARD_CODED)} (infra/soperator/active_checks.py HARD_CODED)")
    found = []
    for line in HARD_CODED[version]:
        where = f"helm/soperator-activechecks/{line.file}:{line.line}"
        matches = [m for p in _LITERAL_NAMES for m in [p.search(line.text)] if m]
        if not matches:
            raise ValueError(f"{where}: recorded as hard-coded, but names no cluster or namespace")
        found += [LiteralName(kind, name, where) for m in matches for kind, name in m.groupdict().items()
                  if kind in ("cluster", "namespace") and name]
    return found


def name_conflicts(cfg: StackConfig) -> list[str]:
    """Where the stack's Slurm cluster or namespace differs from what the activechecks chart hard-codes (none when
    the checks are off)."""
    sop = cfg.soperator
    if sop is None or sop.active_checks.scope == "off":
        return []
    ours = {"cluster": ("soperator.slurmClusterName", cfg.slurm_cluster_name),
            "namespace": ("soperator.namespace", cfg.slurm_namespace)}
    return [f"{ours[n.kind][0]} is {ours[n.kind][1]!r}, but Soperator {sop.version}'s active checks reach the "
            f"{n.kind} {n.name!r} ({n.where})" for n in literal_names(sop.version) if n.name != ours[n.kind][1]]


def checks_deletions(cfg: StackConfig) -> tuple[tuple[str, ...], ...]:
    """Chart defaults the scope removes: ib-gpu-perf's comment reaction where it drains instead (the chart's
    ``checkReactionsConflict`` fails the render with both)."""
    assert cfg.soperator is not None
    if cfg.soperator.active_checks.scope in _IB_DRAINS:
        return (("checks", "ib-gpu-perf", "failureReactions", "commentSlurmNode"),)
    return ()


@dataclass(frozen=True)
class CheckTime:
    """Worker node-hours the checks after creation hold at most (each Slurm job at its time limit)."""

    worker_set: str
    node_hours: float


def node_hours_after_creation(cfg: StackConfig) -> list[CheckTime]:
    """Per worker set, the node-hours of the GPU checks that run after creation: a per-worker check holds every
    node of every set for its time limit, a single job one node of the first set (all are ``--exclusive``)."""
    if cfg.nodes is None:
        return []
    gpu_checks = [c for c in after_creation(cfg) if c.gpu_nodes]
    if not gpu_checks:
        return []
    each = sum(c.time_limit_min for c in gpu_checks if c.each_worker) / 60
    single = sum(c.time_limit_min for c in gpu_checks if not c.each_worker) / 60
    return [CheckTime(w.name, each * w.size + (single if i == 0 else 0.0)) for i, w in enumerate(cfg.nodes.workers)]
