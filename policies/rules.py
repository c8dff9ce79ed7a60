"""Policy rules as plain functions: resources (as the engine sees them), the StackConfig and the run config in,
violation messages out. ``policies/__main__.py`` wraps them in a CrossGuard PolicyPack; ``ftstack plan
--policies`` and the tests call ``evaluate`` on the resources of a run under mocks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from infra import catalog
from infra.config import StackConfig
from infra.cost import monthly_cost

FILESYSTEM = "nebius:index/computeV1Filesystem:ComputeV1Filesystem"
NODE_GROUP = "nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup"
BUCKET = "nebius:index/storageV1Bucket:StorageV1Bucket"
ALLOCATION = "nebius:index/vpcV1Allocation:VpcV1Allocation"
NODESET_LABEL = "slurm.nebius.ai/nodeset"
SERVICE_ROLES = {"system", "controller", "login", "accounting"}
SECRET_PLACEHOLDER = "[secret]"
Enforcement = Literal["mandatory", "advisory", "disabled"]


class Res(BaseModel):
    """One resource: type token, logical name, ``protect`` option and properties."""

    model_config = ConfigDict(frozen=True)

    type: str
    name: str
    urn: str = ""
    protect: bool = False
    props: dict[str, Any] = {}

    @classmethod
    def from_mock(cls, r: Any) -> Res:
        return cls(type=r.type, name=r.name, urn=r.urn, protect=r.protect, props=r.inputs)

    @classmethod
    def from_policy(cls, r: Any) -> Res:
        return cls(type=r.resource_type, name=r.name, urn=r.urn, protect=bool(r.opts.protect),
                   props=_plain(r.props))


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Context:
    """Everything a rule may look at."""

    resources: list[Res]
    cfg: StackConfig
    run: Any | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def of_type(self, type_: str) -> list[Res]:
        return [r for r in self.resources if r.type == type_]


def _role(group: Res) -> str:
    return (group.props.get("labels") or {}).get(NODESET_LABEL, group.props.get("name", group.name))


def _shape(group: Res) -> tuple[str, str]:
    resources = (group.props.get("template") or {}).get("resources") or {}
    return resources.get("platform", ""), resources.get("preset", "")


# --- rules -----------------------------------------------------------------------------------------

def filesystem_quota(ctx: Context) -> list[str]:
    """Shared filesystems (created plus reused) within the project quota (seed 001: 5 TiB)."""
    limit = float(ctx.config.get("maxTotalGib", 5120))
    created = sum(float(r.props.get("sizeGibibytes") or 0) for r in ctx.of_type(FILESYSTEM))
    fs = ctx.cfg.filesystems
    reused = 0.0
    if fs is not None:
        every = [fs.jail, *fs.submounts, fs.controller_spool, fs.accounting]
        reused = sum(float(f.size_gib or 0) for f in every if f is not None and f.existing_id)
    total = created + reused
    if total > limit:
        return [f"shared filesystems total {total:,.0f} GiB exceeds the quota of {limit:,.0f} GiB "
                f"({total - limit:,.0f} GiB over); shrink submounts or raise maxTotalGib with the quota"]
    return []


def monthly_budget(ctx: Context) -> list[str]:
    """Estimated monthly cost (autoscaling at max) within the budget."""
    limit = float(ctx.config.get("maxMonthlyUsd", 50_000))
    cost = monthly_cost(ctx.cfg, ctx.cfg.pricing).usd_high
    if cost > limit:
        return [f"estimated monthly cost ${cost:,.0f} (autoscaling at max) exceeds the budget ${limit:,.0f}"]
    return []


def presets_exist(ctx: Context) -> list[str]:
    """Every node group's preset is offered on its platform."""
    found = []
    for group in ctx.of_type(NODE_GROUP):
        platform, preset = _shape(group)
        try:
            catalog.get_preset(platform, preset)
        except catalog.CatalogError as exc:
            found.append(f"node group {group.name}: {exc}")
    return found


def gpu_workers_have_gpu_presets(ctx: Context) -> list[str]:
    """Worker node groups (Slurm nodesets other than system/controller/login/accounting) carry GPUs."""
    found = []
    for group in ctx.of_type(NODE_GROUP):
        if _role(group) in SERVICE_ROLES:
            continue
        platform, preset = _shape(group)
        try:
            gpus = catalog.get_preset(platform, preset).gpus
        except catalog.CatalogError:
            continue
        if gpus == 0:
            found.append(f"worker node group {group.name}: preset {platform}/{preset} has no GPU")
    return found


def model_fits(ctx: Context) -> list[str]:
    """The run config's model, method, micro-batch and length fit each GPU worker's memory."""
    from workloads.train.memory import estimate
    from workloads.train.model_shapes import UnknownModel, shape_for_source
    from workloads.train.sizing import DoesNotFit, plan_batches, plan_inputs

    if ctx.run is None or ctx.run.train is None or ctx.cfg.nodes is None:
        return []
    try:
        shape = shape_for_source(ctx.run.model.source)
    except UnknownModel as exc:
        return [str(exc)]
    found = []
    for w in ctx.cfg.nodes.workers:
        platform = catalog.get_platform(w.platform)
        if not platform.is_gpu:
            continue
        try:  # the same sizing the trainer does on that GPU (train.micro_batch_tokens / gradient_checkpointing auto)
            inputs = plan_inputs(ctx.run, plan_batches(ctx.run, shape, platform.gpu_memory_gib))
        except DoesNotFit as exc:
            found.append(f"worker set {w.name}: {exc}")
            continue
        need = estimate(shape, inputs)
        if not need.fits(platform.gpu_memory_gib):
            found.append(
                f"worker set {w.name}: {inputs.method} of {ctx.run.model.source} at micro_batch {inputs.micro_batch} x "
                f"{inputs.max_length} tokens needs ~{need.total_gib:.1f} GiB per GPU, {platform.gpu_model} has "
                f"{platform.gpu_memory_gib} GiB ({need.breakdown_gib()})"
            )
    return found


def login_access(ctx: Context) -> list[str]:
    """Login has SSH keys and is the only node with a public address."""
    found = []
    if ctx.cfg.target == "nebius" and not ctx.cfg.ssh_public_keys:
        found.append("sshPublicKeys: login needs at least one SSH public key")
    for group in ctx.of_type(NODE_GROUP):
        interfaces = (group.props.get("template") or {}).get("networkInterfaces") or []
        if any(i.get("publicIpAddress") is not None for i in interfaces) and _role(group) != "login":
            found.append(f"node group {group.name}: has a public IP address; only login may be reachable")
    for alloc in ctx.of_type(ALLOCATION):
        if alloc.props.get("ipv4Public") is not None and "login" not in alloc.name:
            found.append(f"allocation {alloc.name}: public address not used by login")
    return found


def _exempt(ctx: Context) -> bool:
    return ctx.cfg.stack in list(ctx.config.get("exemptStacks", ["dev"]))


def data_protected(ctx: Context) -> list[str]:
    """Filesystems holding data (every shared filesystem) have Pulumi protect and forbidDeletion."""
    if _exempt(ctx):
        return []
    return [f"filesystem {r.name}: deletion protection off (protect={r.protect}, "
            f"forbidDeletion={r.props.get('forbidDeletion')})"
            for r in ctx.of_type(FILESYSTEM) if not (r.protect and r.props.get("forbidDeletion"))]


def jail_backed_up(ctx: Context) -> list[str]:
    """The jail is backed up to a bucket with retention."""
    if _exempt(ctx) or ctx.cfg.target != "nebius":
        return []
    buckets = ctx.cfg.buckets
    if buckets is None or not buckets.backups.enabled:
        return ["buckets.backups: the jail is not backed up (enable backups with a retention)"]
    if not any(r.name.endswith("-backups") for r in ctx.of_type(BUCKET)):
        return ["no backups bucket among the stack's resources"]
    return []


def artifacts_versioned(ctx: Context) -> list[str]:
    """The artifacts bucket keeps versions."""
    return [f"bucket {r.name}: versioningPolicy is {r.props.get('versioningPolicy')!r}, not 'ENABLED'"
            for r in ctx.of_type(BUCKET)
            if r.name.endswith("-artifacts") and r.props.get("versioningPolicy") != "ENABLED"]


def preemptible_needs_resume(ctx: Context) -> list[str]:
    """Preemptible workers only when training checkpoints and Slurm requeues the job."""
    if ctx.cfg.nodes is None:
        return []
    spot = [w.name for w in ctx.cfg.nodes.workers if w.preemptible]
    if not spot:
        return []
    train = ctx.run.train if ctx.run is not None else None
    save_steps = train.save_steps if train is not None else 0
    requeue = train.requeue if train is not None else False
    if not save_steps or not requeue:
        return [f"worker sets {', '.join(spot)} are preemptible but the run config's train section has "
                f"save_steps={save_steps!r}, requeue={requeue!r}: set both so a preempted job resumes"]
    return []


_SECRET_VALUE = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----|\bAKIA[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{20,}"
    r"|\bhf_[A-Za-z0-9]{30,}|\bxox[abpr]-[A-Za-z0-9-]{10,}|\bsk-[A-Za-z0-9_-]{20,}"
    r"|\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.|\bv1\.[A-Za-z0-9_-]{40,}"
)
_SECRET_KEY = re.compile(r"(token|password|passwd|secret|api_?key|private_?key|access_?key)", re.IGNORECASE)


def _walk(value: Any, path: str) -> Iterable[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, value


def secret_looking_values(config_values: Mapping[str, Any], resources: Iterable[Res]) -> list[str]:
    """Secret-looking plain values: by content anywhere, by key name in the stack config."""
    found = []
    for path, value in _walk(dict(config_values), ""):
        if not isinstance(value, str) or not value or value == SECRET_PLACEHOLDER:
            continue
        leaf = re.split(r"[.\[]", path)[-1] if "." in path or "[" in path else path
        if _SECRET_VALUE.search(value) or _SECRET_KEY.search(leaf):
            found.append(f"stack config {path}: looks like a secret in plain text; use pulumi config set --secret")
    for r in resources:
        for path, value in _walk(r.props, ""):
            if isinstance(value, str) and _SECRET_VALUE.search(value):
                found.append(f"resource {r.name} property {path}: secret-looking plain value")
    return found


def no_plain_secrets(ctx: Context) -> list[str]:
    """No private key or token in plain stack config or resource properties."""
    return secret_looking_values(ctx.cfg.model_dump(by_alias=True, mode="json"), ctx.resources)


# --- the pack's table ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PolicySpec:
    name: str
    description: str
    check: Callable[[Context], list[str]]
    enforcement: Enforcement = "mandatory"
    config_schema: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


_EXEMPT = {"exemptStacks": {"type": "array", "items": {"type": "string"}, "default": ["dev"],
                            "description": "throwaway stacks allowed to skip this rule"}}

POLICIES: tuple[PolicySpec, ...] = (
    PolicySpec("filesystem-quota", filesystem_quota.__doc__ or "", filesystem_quota,
               config_schema={"maxTotalGib": {"type": "number", "default": 5120,
                                              "description": "project quota for shared filesystems, GiB"}}),
    PolicySpec("monthly-budget", monthly_budget.__doc__ or "", monthly_budget,
               config_schema={"maxMonthlyUsd": {"type": "number", "default": 50000,
                                                "description": "budget for the estimated monthly cost, USD"}}),
    PolicySpec("preset-exists", presets_exist.__doc__ or "", presets_exist),
    PolicySpec("gpu-workers-gpu-preset", gpu_workers_have_gpu_presets.__doc__ or "", gpu_workers_have_gpu_presets),
    PolicySpec("model-fits-gpu", model_fits.__doc__ or "", model_fits),
    PolicySpec("login-only-public", login_access.__doc__ or "", login_access),
    PolicySpec("data-filesystems-protected", data_protected.__doc__ or "", data_protected, config_schema=_EXEMPT),
    PolicySpec("jail-backed-up", jail_backed_up.__doc__ or "", jail_backed_up, config_schema=_EXEMPT),
    PolicySpec("artifacts-versioned", artifacts_versioned.__doc__ or "", artifacts_versioned),
    PolicySpec("preemptible-needs-resume", preemptible_needs_resume.__doc__ or "", preemptible_needs_resume),
    PolicySpec("no-plain-secrets", no_plain_secrets.__doc__ or "", no_plain_secrets),
)


def defaults(spec: PolicySpec) -> dict[str, Any]:
    return {k: v["default"] for k, v in spec.config_schema.items() if "default" in v}


class Result(BaseModel):
    policy: str
    enforcement: Enforcement
    passed: bool
    violations: list[str]


def evaluate(resources: list[Res], cfg: StackConfig, run: Any | None = None,
             config: Mapping[str, Mapping[str, Any]] | None = None) -> list[Result]:
    """Every policy on one stack; ``config`` maps policy name to overrides (and ``enforcementLevel``)."""
    results = []
    for spec in POLICIES:
        own = dict((config or {}).get(spec.name, {}))
        level = own.pop("enforcementLevel", spec.enforcement)
        if level == "disabled":
            results.append(Result(policy=spec.name, enforcement=level, passed=True, violations=[]))
            continue
        violations = spec.check(Context(resources, cfg, run, defaults(spec) | own))
        results.append(Result(policy=spec.name, enforcement=level, passed=not violations, violations=violations))
    return results


def mandatory_failures(results: Iterable[Result]) -> list[Result]:
    return [r for r in results if not r.passed and r.enforcement == "mandatory"]
