"""Policy rules as plain functions: resources (as the engine sees them), the StackConfig and the run config in,
violation messages out. ``policies/__main__.py`` wraps them in a CrossGuard PolicyPack; ``ftstack plan
--policies`` and the tests call ``evaluate`` on the resources of a run under mocks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from planning import catalog
from infra.config import REPO_ROOT, StackConfig
from infra.cost.price import CostReport, price_stack
from infra.cost.render import training_cost_text
from infra.nebius.layout import layout
from infra.runs.measured import price_inputs
from planning.fit import planned_throughput, worker_fits
from infra.storage_fit import storage_use, storage_violations
from planning.planner import refusals
from planning.model_shapes import UnknownModel, shape_for_source

FILESYSTEM = "nebius:index/computeV1Filesystem:ComputeV1Filesystem"
NODE_GROUP = "nebius:index/mk8sV1NodeGroup:Mk8sV1NodeGroup"
BUCKET = "nebius:index/storageV1Bucket:StorageV1Bucket"
ALLOCATION = "nebius:index/vpcV1Allocation:VpcV1Allocation"
RELEASE = "kubernetes:helm.sh/v3:Release"
K8S_SECRET = "kubernetes:core/v1:Secret"
BACKUP_CHART = "helm-soperator-backup-config"
BACKUP_SECRET = "jail-backup"
NODESET_LABEL = "slurm.nebius.ai/nodeset"
SERVICE_ROLES = {"system", "controller", "login", "accounting"}
SECRET_PLACEHOLDER = "[secret]"
Enforcement = Literal["mandatory", "advisory", "disabled"]


class Unknown:
    """A property value the engine does not know yet (a preview of resources not created)."""

    _instance: Unknown | None = None

    def __new__(cls) -> Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown>"

    def __deepcopy__(self, _memo: dict) -> Unknown:
        return self


UNKNOWN = Unknown()
# The wire sentinels of unknown values (pulumi.runtime.rpc.UNKNOWN, pulumi_policy.proxy UNKNOWN_*_VALUE)
_UNKNOWN_SENTINELS = frozenset({
    "04da6b54-80e4-46f7-96ec-b56ff0331ba9", "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7",
    "3eeb2bf0-c639-47a8-9e75-3b44932eb421", "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2",
    "030794c1-ac77-496b-92df-f27374a8bd58", "e48ece36-62e2-4504-bad9-02848725956a",
    "dd056dcd-154b-4c76-9bd3-c8f88648b5ff",
})


class Res(BaseModel):
    """One resource: type token, logical name, ``protect`` option and properties."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    type: str
    name: str
    urn: str = ""
    protect: bool = False
    props: dict[str, Any] = {}

    @classmethod
    def from_mock(cls, r: Any) -> Res:
        return cls(type=r.type, name=r.name, urn=r.urn, protect=r.protect, props=_plain(r.inputs))

    @classmethod
    def from_policy(cls, r: Any) -> Res:
        return cls(type=r.resource_type, name=r.name, urn=r.urn, protect=bool(r.opts.protect),
                   props=_plain(r.props))


def _plain(value: Any) -> Any:
    """Plain dicts and lists; every unknown value (however the engine marks it) becomes ``UNKNOWN``.

    pulumi-policy's props proxy raises ``UnknownValueError`` on reading an unknown value; reading each key
    on its own keeps the rest of the resource checkable.
    """
    if isinstance(value, str) and value in _UNKNOWN_SENTINELS:
        return UNKNOWN
    if isinstance(value, Mapping):
        out = {}
        for key in list(value):
            out[str(key)] = _read(value, key)
        return out
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_read(value, i) for i in range(len(value))]
    return value


def _read(container: Any, key: Any) -> Any:
    try:
        item = container[key]
    except Exception as exc:  # pulumi_policy.proxy.UnknownValueError: no import, the pack may be absent
        if type(exc).__name__ == "UnknownValueError":
            return UNKNOWN
        raise
    return _plain(item)


@dataclass(frozen=True)
class Context:
    """Everything a rule may look at; ``unchecked`` collects what a rule could not check (unknown values)."""

    resources: list[Res]
    cfg: StackConfig
    run: Any | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    unchecked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What a rule reports beside its verdict (the estimated training cost beside the monthly TCO)."""
    priced: dict[str, CostReport] = field(default_factory=dict)
    """The stack's price once computed, shared by the rules of one evaluation (it reads the stack's stored runs)."""

    def of_type(self, type_: str) -> list[Res]:
        return [r for r in self.resources if r.type == type_]

    def prop(self, res: Res, path: str, default: Any = None) -> Any:
        """``res.props`` at a dotted path; ``UNKNOWN`` (and noted in ``unchecked``) where unknown."""
        value: Any = res.props
        for key in path.split("."):
            if value is UNKNOWN:
                break
            if not isinstance(value, Mapping) or value.get(key) is None:
                return default
            value = value[key]
        if _contains_unknown(value):
            self.unchecked.append(f"{res.name}: {path} is unknown until the resource exists")
            return UNKNOWN
        return value


def _contains_unknown(value: Any) -> bool:
    if value is UNKNOWN:
        return True
    if isinstance(value, Mapping):
        return any(_contains_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_contains_unknown(v) for v in value)
    return False


def _role(ctx: Context, group: Res) -> str | Unknown:
    labels = ctx.prop(group, "labels", {})
    if labels is UNKNOWN:
        return UNKNOWN
    return labels.get(NODESET_LABEL) or group.props.get("name") or group.name


def _shape(ctx: Context, group: Res) -> tuple[str, str] | None:
    resources = ctx.prop(group, "template.resources", {})
    if resources is UNKNOWN:
        return None
    return resources.get("platform", ""), resources.get("preset", "")


# --- rules -----------------------------------------------------------------------------------------

def filesystem_quota(ctx: Context) -> list[str]:
    """Shared filesystems (created plus reused) within the project quota (seed 001: 5 TiB)."""
    limit = float(ctx.config.get("maxTotalGib", 5120))
    sizes = [ctx.prop(r, "sizeGibibytes", 0) for r in ctx.of_type(FILESYSTEM)]
    created = sum(float(size) for size in sizes if size is not UNKNOWN)
    reused = sum(float(f.size_gib or 0) for f in layout(ctx.cfg).filesystems if not f.created)
    total = created + reused
    if total > limit:
        return [f"shared filesystems total {total:,.0f} GiB exceeds the quota of {limit:,.0f} GiB "
                f"({total - limit:,.0f} GiB over); shrink submounts or raise maxTotalGib with the quota"]
    return []


def stack_price(ctx: Context) -> CostReport:
    """The stack's price as `pulumi up` computes it (the one price path, with the stack's stored runs), computed
    once per evaluation."""
    if ctx.cfg.stack not in ctx.priced:
        ctx.priced[ctx.cfg.stack] = price_stack(ctx.cfg, price_inputs(ctx.cfg, REPO_ROOT), ctx.run)
    return ctx.priced[ctx.cfg.stack]


def monthly_budget(ctx: Context) -> list[str]:
    """Estimated monthly cost (autoscaling at max) within the budget; the training run's cost beside it."""
    limit = float(ctx.config.get("maxMonthlyUsd", 50_000))
    report = stack_price(ctx)
    cost = report.monthly.usd_high
    training = training_cost_text(report)
    ctx.notes.append(f"monthly cost ${cost:,.0f} (autoscaling at max)" + (f"; {training}" if training else ""))
    if cost > limit:
        return [f"estimated monthly cost ${cost:,.0f} (autoscaling at max) exceeds the budget ${limit:,.0f}"
                + (f" (besides: {training})" if training else "")]
    return []


def presets_exist(ctx: Context) -> list[str]:
    """Every node group's preset is offered on its platform."""
    found = []
    for group in ctx.of_type(NODE_GROUP):
        shape = _shape(ctx, group)
        if shape is None:
            continue
        platform, preset = shape
        try:
            catalog.get_preset(platform, preset)
        except catalog.CatalogError as exc:
            found.append(f"node group {group.name}: {exc}")
    return found


def gpu_workers_have_gpu_presets(ctx: Context) -> list[str]:
    """Worker node groups (Slurm nodesets other than system/controller/login/accounting) carry GPUs."""
    found = []
    for group in ctx.of_type(NODE_GROUP):
        role, shape = _role(ctx, group), _shape(ctx, group)
        if role is UNKNOWN or role in SERVICE_ROLES or shape is None:
            continue
        platform, preset = shape
        try:
            gpus = catalog.get_preset(platform, preset).gpus
        except catalog.CatalogError:
            continue
        if gpus == 0:
            found.append(f"worker node group {group.name}: preset {platform}/{preset} has no GPU")
    return found


def model_fits(ctx: Context) -> list[str]:
    """The run config's model and method fit each GPU worker set: the parallelism the run will use there (DDP, or
    FSDP over the set's GPUs) within memory_fraction of each GPU; otherwise the smallest node count that fits."""
    if ctx.run is None or ctx.run.train is None or ctx.cfg.nodes is None:
        return []
    report = stack_price(ctx)
    training = training_cost_text(report)
    if training:
        ctx.notes.append(training)
    try:
        shape = shape_for_source(ctx.run.model.source)
    except UnknownModel as exc:
        return [str(exc)]
    found = []
    for fit in worker_fits(ctx.cfg.plan_stack(), ctx.run, shape, planned_throughput(report.plan)):
        line = f"{ctx.run.train.method} of {ctx.run.model.source}: {fit.describe()}"
        (ctx.notes if fit.fits else found).append(line)
    return found


def plan_accepted(ctx: Context) -> list[str]:
    """The run's plan (documents/run_plan.py, the one the chain submits) is one the planner accepts: the adapter rank
    within a set serve.max_lora_rank (else derived from the adapters served), a training time limit within a year."""
    plan = stack_price(ctx).plan
    if plan is None:
        return []
    if plan.serving is not None:
        ctx.notes.append(f"serving: engine {plan.serving.engine}, --max-lora-rank {plan.serving.max_lora_rank} "
                         f"({plan.serving.basis})")
    return refusals(plan)


def storage_fits(ctx: Context) -> list[str]:
    """Every path of the run config lies on a filesystem the stack mounts, and what the run writes on each filesystem
    (base model, data, the kept checkpoints, exported models, the Python environment) fits its size."""
    if ctx.run is None or ctx.cfg.filesystems is None:
        return []
    try:
        shape = shape_for_source(ctx.run.model.source)
    except UnknownModel as exc:
        return [str(exc)]
    ctx.notes.extend(u.line() for u in storage_use(ctx.cfg, ctx.run, shape))
    return storage_violations(ctx.cfg, ctx.run, shape)


def login_access(ctx: Context) -> list[str]:
    """Login has SSH keys and is the only node with a public address."""
    found = []
    if ctx.cfg.target == "nebius" and not ctx.cfg.ssh_public_keys:
        found.append("sshPublicKeys: login needs at least one SSH public key")
    for group in ctx.of_type(NODE_GROUP):
        interfaces = ctx.prop(group, "template.networkInterfaces", [])
        if interfaces is UNKNOWN:
            continue
        public = any(isinstance(i, Mapping) and i.get("publicIpAddress") is not None for i in interfaces)
        if public and _role(ctx, group) != "login":
            found.append(f"node group {group.name}: has a public IP address; only login may be reachable")
    for alloc in ctx.of_type(ALLOCATION):
        if ctx.prop(alloc, "ipv4Public") not in (None, UNKNOWN) and "login" not in alloc.name:
            found.append(f"allocation {alloc.name}: public address not used by login")
    return found


def _exempt(ctx: Context) -> bool:
    return ctx.cfg.stack in list(ctx.config.get("exemptStacks", ["dev"]))


def data_protected(ctx: Context) -> list[str]:
    """Filesystems holding data (every shared filesystem) have Pulumi protect and forbidDeletion."""
    if _exempt(ctx):
        return []
    found = []
    for r in ctx.of_type(FILESYSTEM):
        guard = ctx.prop(r, "forbidDeletion")
        if guard is not UNKNOWN and not (r.protect and guard):
            found.append(f"filesystem {r.name}: deletion protection off (protect={r.protect}, forbidDeletion={guard})")
    return found


def jail_backed_up(ctx: Context) -> list[str]:
    """The jail is backed up: a backups bucket, the k8up Schedule (helm-soperator-backup-config) writing
    into it on a schedule with a prune keeping ``retentionDays`` daily copies, and its credentials Secret."""
    if _exempt(ctx) or ctx.cfg.target != "nebius":
        return []
    buckets = ctx.cfg.buckets
    if buckets is None or not buckets.backups.enabled:
        return ["buckets.backups: the jail is not backed up (enable backups with a retention)"]
    bucket = next((r for r in ctx.of_type(BUCKET) if r.name.endswith("-backups")), None)
    if bucket is None:
        return ["no backups bucket among the stack's resources"]
    schedules = [r for r in ctx.of_type(RELEASE) if str(r.props.get("chart", "")).endswith(BACKUP_CHART)]
    if not schedules:
        return [f"no {BACKUP_CHART} release: nothing writes backups into bucket {bucket.name}"]
    found = []
    for release in schedules:
        for path, check in (
            ("values.backup.schedule", lambda v: isinstance(v, str) and v.strip() != ""),
            ("values.prune.schedule", lambda v: isinstance(v, str) and v.strip() != ""),
            ("values.prune.retention.keepDaily", lambda v: v == buckets.backups.retention_days),
        ):
            value = ctx.prop(release, path)
            if value is not UNKNOWN and not check(value):
                found.append(f"release {release.name}: {path} is {value!r} (want a schedule; keepDaily "
                             f"{buckets.backups.retention_days} = buckets.backups.retentionDays)")
        target, name = ctx.prop(release, "values.bucket.name"), ctx.prop(bucket, "name")
        if UNKNOWN not in (target, name) and target != name:
            found.append(f"release {release.name}: writes to bucket {target!r}, not the backups bucket {name!r}")
    secrets = [r for r in ctx.of_type(K8S_SECRET) if ctx.prop(r, "metadata.name") in (BACKUP_SECRET, UNKNOWN)]
    if not secrets:
        found.append(f"no Secret {BACKUP_SECRET}: k8up has no credentials for the bucket")
    return found


def artifacts_versioned(ctx: Context) -> list[str]:
    """The artifacts bucket keeps versions."""
    found = []
    for r in ctx.of_type(BUCKET):
        policy = ctx.prop(r, "versioningPolicy") if r.name.endswith("-artifacts") else "ENABLED"
        if policy not in ("ENABLED", UNKNOWN):
            found.append(f"bucket {r.name}: versioningPolicy is {policy!r}, not 'ENABLED'")
    return found


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
    for r in ctx.resources:
        unknown = [path for path, value in _walk(r.props, "") if value is UNKNOWN]
        if unknown:
            ctx.unchecked.append(f"{r.name}: {len(unknown)} unknown value(s) not scanned ({', '.join(unknown[:3])})")
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
    PolicySpec("run-plan-accepted", plan_accepted.__doc__ or "", plan_accepted),
    PolicySpec("storage-fits", storage_fits.__doc__ or "", storage_fits),
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
    unchecked: list[str] = []
    """What the rule could not check because a value was unknown (a preview before resources exist)."""
    notes: list[str] = []
    """What the rule reports beside its verdict (the training run's cost, marked measured or estimated)."""


def evaluate(resources: list[Res], cfg: StackConfig, run: Any | None = None,
             config: Mapping[str, Mapping[str, Any]] | None = None) -> list[Result]:
    """Every policy on one stack; ``config`` maps policy name to overrides (and ``enforcementLevel``)."""
    results, priced = [], {}
    for spec in POLICIES:
        own = dict((config or {}).get(spec.name, {}))
        level = own.pop("enforcementLevel", spec.enforcement)
        if level == "disabled":
            results.append(Result(policy=spec.name, enforcement=level, passed=True, violations=[]))
            continue
        ctx = Context(resources, cfg, run, defaults(spec) | own, priced=priced)
        violations = spec.check(ctx)
        results.append(Result(policy=spec.name, enforcement=level, passed=not violations, violations=violations,
                              unchecked=sorted(set(ctx.unchecked)), notes=ctx.notes))
    return results


def mandatory_failures(results: Iterable[Result]) -> list[Result]:
    return [r for r in results if not r.passed and r.enforcement == "mandatory"]
