"""The cost model: pure functions from a StackConfig and a PriceBook to monthly TCO, training-run cost
and cost per chat. No cloud calls; every figure is reproducible from the stack file and planning/prices.py.

- A node costs its hourly price x 730 h; an autoscaled group is priced at min_size (low) and
  max_size (high). Elastic GPU workers (0..N, powered up by jobs) make the low end the idle cluster; the
  always-on range prices every worker at its maximum and the other groups as above (seed 000's table,
  $18,124 to $19,054, is that range: its five workers ran all month). Separately billed platforms: GPUs x GPU-hour + vCPUs x vCPU-hour + GiB x GiB-hour;
  bundled platforms (H100/H200): GPUs x bundled GPU-hour.
- Workers reserved for serving (``serving.nodes``, taken from the first worker set) are lines of their own
  (``compute_serving_<set>``, ``boot_disk_serving_<set>``); the worker lines then count the training nodes.
- Boot disks, filesystems and buckets cost GiB x GiB-month. Backups hold ``retention_days`` daily
  copies of ``copy_size_gib`` (default: the jail size).
- Cost per chat: tokens/s x 86,400 = tokens/day; / output tokens per chat = conversations/day;
  daily cluster cost = monthly high / days_per_month (30, as in seed 000: the cluster runs all month,
  workers busy with continuous post-training); cost per chat = daily cost / conversations.
- Training run: as the run's plan has it (planning/planner.py `train_cost`: tokens x epochs / (tokens/s per GPU x
  the planned GPUs) = wall time, linear scaling; cost = wall hours x the planned nodes' hourly price); GPU-hours are
  the wall hours on every planned GPU.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from documents.run_plan import StageCost, TrainingSize
from planning import catalog
from infra.config import BootDisk, StackConfig, WorkerSet
from planning.prices import HOURS_PER_MONTH, ChatAssumptions, PriceBook, PricingConfig, node_price
from infra.monitoring import releases as mon
from infra.nebius.layout import (ACCOUNTING, CONTROLLER_SPOOL, JAIL, SUBMOUNT_PREFIX, FilesystemSpec, Layout,
                                 NodeGroupSpec, layout)
from infra.soperator import active_checks

SECONDS_PER_DAY = 86_400
CATEGORIES = ("compute", "boot_disks", "volumes", "shared_fs", "object_storage", "networking")
ONE_OFF = "one_off"
"""Category of lines paid once (not monthly): outside the monthly totals."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CostLine(_Frozen):
    """One priced resource. ``usd_low``/``usd_high`` differ only for autoscaled groups."""

    key: str
    category: str
    label: str
    quantity: str
    unit_price: str
    usd_low: float
    usd_high: float
    price_keys: tuple[str, ...]
    note: str = ""


class MonthlyCost(_Frozen):
    lines: tuple[CostLine, ...]
    usd_low: float
    usd_high: float
    categories: dict[str, tuple[float, float]]
    pricing_date: str
    always_on_usd_low: float
    """the low end with every worker node up all month (workers at their maximum, other groups at their minimum)"""
    always_on_usd_high: float
    hours_per_month: int = HOURS_PER_MONTH


class ChatScenario(_Frozen):
    name: str
    tokens_per_second: float
    tokens_per_day: float
    conversations_per_day: float
    daily_cost_usd: float
    usd_per_chat: float


class TrainingRun(_Frozen):
    tokens: float
    epochs: float
    tokens_per_second_per_gpu: float | None
    throughput_source: str
    throughput_kind: str = "unknown"
    """configured, measured, borrowed, estimated or unknown (planning.throughput.TrainingThroughput.kind)."""
    gpus: int
    gpu_hours: float | None
    wall_hours: float | None
    usd: float | None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _node_line(key: str, label: str, platform: str, preset: str, low: int, high: int,
               book: PriceBook, preemptible: bool = False) -> CostLine:
    price = node_price(platform, preset, book, preemptible=preemptible)
    monthly = price.usd_per_hour * HOURS_PER_MONTH
    count = (f"{low} node" if low == 1 else f"{low} nodes") if low == high else f"{low} to {high} nodes"
    return CostLine(
        key=f"compute_{_slug(key)}", category="compute", label=f"{label} ({platform}, {preset})",
        quantity=count, unit_price=f"${price.usd_per_hour:.2f}/node/hour",
        usd_low=monthly * low, usd_high=monthly * high, price_keys=price.price_keys, note=price.note,
    )


def _disk_line(key: str, label: str, disk: BootDisk, low: int, high: int, book: PriceBook) -> CostLine:
    price_key = f"disk.{disk.type}"
    per_gib = book.get(price_key).usd
    count = f"{low}" if low == high else f"{low} to {high}"
    return CostLine(
        key=f"boot_disk_{_slug(key)}", category="boot_disks", label=f"{label} ({disk.size_gib} GiB {disk.type})",
        quantity=f"{count} x {disk.size_gib} GiB", unit_price=f"${per_gib}/GiB/month",
        usd_low=per_gib * disk.size_gib * low, usd_high=per_gib * disk.size_gib * high, price_keys=(price_key,),
    )


def _fs_line(key: str, label: str, fs: FilesystemSpec, book: PriceBook) -> CostLine:
    if fs.size_gib is None:
        raise ValueError(f"filesystems.{key}: an existing filesystem needs sizeGib for the cost estimate")
    price_key = f"filesystem.{fs.type}"
    per_gib = book.get(price_key).usd
    usd = per_gib * fs.size_gib
    return CostLine(
        key=f"shared_fs_{_slug(key)}", category="shared_fs", label=label, quantity=f"{fs.size_gib} GiB",
        unit_price=f"${per_gib}/GiB/month", usd_low=usd, usd_high=usd, price_keys=(price_key,),
        note="existing filesystem" if fs.existing_id else "",
    )


def _bucket_line(key: str, label: str, copies: int, gib: float, book: PriceBook) -> CostLine:
    per_gib = book.get("object_storage.standard").usd
    usd = per_gib * gib * copies
    quantity = f"{copies} x {gib:g} GiB" if copies > 1 else f"{gib:g} GiB"
    return CostLine(
        key=f"object_storage_{key}", category="object_storage", label=label, quantity=quantity,
        unit_price=f"${per_gib}/GiB/month", usd_low=usd, usd_high=usd, price_keys=("object_storage.standard",),
    )


def _groups(plan: Layout) -> list:
    """Worker groups first, then system, controller, login, accounting (the seed's table order)."""
    return sorted(plan.node_groups, key=lambda g: g.role != "worker")


def _line_key_label(group) -> tuple[str, str]:
    if group.role == "worker":
        return f"worker_{group.name}", f"Worker nodes {group.name}"
    return group.role, f"{group.role.capitalize()} nodes"


def _counts(group) -> tuple[int, int]:
    if group.fixed_size is not None:
        return group.fixed_size, group.fixed_size
    return group.min_size, group.max_size


def _priced_groups(plan: Layout, serving_nodes: int) -> list[tuple[str, str, int, int, NodeGroupSpec]]:
    """(key, label, low, high, group) per line: with `serving_nodes` reserved, the first worker group's serving nodes
    are a line of their own (`serving_<name>`) and its worker line counts the training nodes only."""
    first = next((g for g in plan.node_groups if g.role == "worker"), None)
    priced = []
    for group in _groups(plan):
        key, label = _line_key_label(group)
        low, high = _counts(group)
        if serving_nodes and group is first:
            priced.append((key, f"Worker nodes {group.name} (training)", max(low - serving_nodes, 0),
                           high - serving_nodes, group))
            priced.append((f"serving_{group.name}", f"Serving nodes {group.name}", serving_nodes, serving_nodes, group))
            continue
        priced.append((key, label, low, high, group))
    return priced


def compute_lines(plan: Layout, book: PriceBook, serving_nodes: int = 0) -> list[CostLine]:
    return [_node_line(key, label, g.platform, g.preset, low, high, book, preemptible=g.preemptible)
            for key, label, low, high, g in _priced_groups(plan, serving_nodes)]


def boot_disk_lines(plan: Layout, book: PriceBook, serving_nodes: int = 0) -> list[CostLine]:
    return [_disk_line(key, label, g.boot_disk, low, high, book)
            for key, label, low, high, g in _priced_groups(plan, serving_nodes)]


def filesystem_lines(plan: Layout, book: PriceBook) -> list[CostLine]:
    """Every shared filesystem the stack attaches, in the seed's order (jail, submounts, spool, accounting)."""
    lines = []
    for fs in plan.filesystems:
        if fs.mount_tag == JAIL:
            lines.append(_fs_line("jail", "slurm-jail filesystem", fs, book))
        elif fs.mount_tag.startswith(f"{SUBMOUNT_PREFIX}-"):
            name = fs.mount_tag.removeprefix(f"{SUBMOUNT_PREFIX}-")
            lines.append(_fs_line(name, f"{name} submount ({fs.mount_path})", fs, book))
        elif fs.mount_tag == CONTROLLER_SPOOL:
            lines.append(_fs_line("controller_spool", "controller_spool filesystem (slurmctld state)", fs, book))
        elif fs.mount_tag == ACCOUNTING:
            lines.append(_fs_line("accounting", "accounting filesystem (MariaDB data)", fs, book))
    return lines


def backup_copy_gib(cfg: StackConfig) -> int:
    """Size of one jail backup: ``copy_size_gib`` or the jail's size."""
    backups = cfg.buckets.backups if cfg.buckets else None
    if backups and backups.copy_size_gib:
        return backups.copy_size_gib
    if cfg.filesystems and cfg.filesystems.jail.size_gib:
        return cfg.filesystems.jail.size_gib
    raise ValueError("buckets.backups.copySizeGib: required when the jail is an existing filesystem without sizeGib")


def bucket_lines(cfg: StackConfig, pricing: PricingConfig, book: PriceBook) -> list[CostLine]:
    if cfg.target != "nebius" or cfg.buckets is None:
        return []
    lines = []
    backups = cfg.buckets.backups
    if backups.enabled:
        lines.append(_bucket_line("backups", "Daily jail backups", backups.retention_days, backup_copy_gib(cfg), book))
    if cfg.buckets.artifacts.enabled:
        label = "Artifacts bucket (run configs, adapters; versioned)"
        lines.append(_bucket_line("artifacts", label, 1, pricing.artifacts_gib, book))
    return lines


def network_lines(cfg: StackConfig, book: PriceBook) -> list[CostLine]:
    if cfg.target != "nebius":
        return []
    price = book.get("network.public_ip")
    usd = price.usd * HOURS_PER_MONTH
    unit = "free" if price.usd == 0 else f"${price.usd}/hour"
    return [CostLine(key="networking_login_public_ip", category="networking", label="Public IP address (login)",
                     quantity="1", unit_price=unit, usd_low=usd, usd_high=usd, price_keys=("network.public_ip",))]


def monitoring_lines(cfg: StackConfig, plan: Layout, book: PriceBook) -> list[CostLine]:
    """The capacity the monitoring pods request on the system node group and the metrics store's volume.

    vmagent and vmsingle run on the autoscaled system group: priced as the vCPUs and GiB they request at that
    platform's rates, since the autoscaler adds that capacity for them. The DCGM exporter runs inside the
    daemonset reserve of GPU workers already priced whole.
    """
    if not cfg.monitoring_on:
        return []
    system = next(g for g in plan.node_groups if g.role == "system")
    vcpu_key, ram_key = f"compute.{system.platform}.vcpu", f"compute.{system.platform}.ram"
    vcpus = sum(p.cpu_m for p in mon.SYSTEM_PODS) / 1000
    ram_gib = sum(p.memory_mib for p in mon.SYSTEM_PODS) / 1024
    hourly = vcpus * book.get(vcpu_key).usd + ram_gib * book.get(ram_key).usd
    compute = hourly * HOURS_PER_MONTH
    disk_key = f"disk.{mon.VOLUME_DISK_TYPE}"
    per_gib = book.get(disk_key).usd
    gib = cfg.monitoring.storage_gib
    return [
        CostLine(key="compute_monitoring", category="compute",
                 label=f"Monitoring pods on system nodes (vmagent, vmsingle; {system.platform})",
                 quantity=f"{vcpus:g} vCPU, {ram_gib:g} GiB", unit_price=f"${hourly:.3f}/hour",
                 usd_low=compute, usd_high=compute, price_keys=(vcpu_key, ram_key),
                 note="requested capacity of the autoscaled system group"),
        CostLine(key="volume_monitoring_metrics", category="volumes",
                 label=f"VictoriaMetrics volume ({gib} GiB {mon.VOLUME_DISK_TYPE})", quantity=f"{gib} GiB",
                 unit_price=f"${per_gib}/GiB/month", usd_low=per_gib * gib, usd_high=per_gib * gib,
                 price_keys=(disk_key,)),
    ]


def active_checks_lines(cfg: StackConfig, book: PriceBook) -> list[CostLine]:
    """The worker time Soperator's active checks hold after creation (each check at its Slurm time limit, an upper
    bound), at the workers' hourly price: paid once, before the first job can use those nodes."""
    lines = []
    workers = {w.name: w for w in cfg.nodes.workers} if cfg.nodes else {}
    for use in active_checks.node_hours_after_creation(cfg):
        worker = workers[use.worker_set]
        price = node_price(worker.platform, worker.preset, book, preemptible=worker.preemptible)
        usd = use.node_hours * price.usd_per_hour
        scope = cfg.soperator.active_checks.scope if cfg.soperator else "off"
        lines.append(CostLine(
            key=f"one_off_active_checks_{_slug(worker.name)}", category=ONE_OFF,
            label=f"One-off: active checks after creation ({scope} scope), worker nodes {worker.name}",
            quantity=f"{use.node_hours:.2f} node-hours ({use.node_hours * worker.shape.gpus:.2f} GPU-hours)",
            unit_price=f"${price.usd_per_hour:.2f}/node/hour", usd_low=usd, usd_high=usd,
            price_keys=price.price_keys, note="once after creation, at most (Slurm time limits); not monthly",
        ))
    return lines


def monthly_cost(cfg: StackConfig, pricing: PricingConfig | None = None, book: PriceBook | None = None,
                 plan: Layout | None = None) -> MonthlyCost:
    """Every priced line of the stack, per-category and overall totals (low: autoscaling min, high: max).

    Node groups and filesystems come from ``plan`` (the run's one layout), computed here when not given.
    The NVIDIA GPU/network operators (Nebius applications) and k8up run on the nodes priced here and add
    no line of their own; the backups they write are the ``object_storage_backups`` line. Monitoring adds
    ``compute_monitoring`` and ``volume_monitoring_metrics``; active checks a one-off line outside the totals.
    """
    pricing = pricing or PricingConfig()
    book = book or PriceBook(pricing.overrides)
    plan = plan or layout(cfg)
    serving = cfg.serving.nodes
    lines = (compute_lines(plan, book, serving) + boot_disk_lines(plan, book, serving) + filesystem_lines(plan, book)
             + bucket_lines(cfg, pricing, book) + network_lines(cfg, book) + monitoring_lines(cfg, plan, book)
             + active_checks_lines(cfg, book))
    monthly = [line for line in lines if line.category != ONE_OFF]
    categories = {
        c: (sum(l.usd_low for l in lines if l.category == c), sum(l.usd_high for l in lines if l.category == c))
        for c in CATEGORIES
    }
    keys = {k for line in lines for k in line.price_keys}
    workers = {f"{kind}_{_slug(key)}" for key, _, _, _, g in _priced_groups(plan, serving) if g.role == "worker"
               for kind in ("compute", "boot_disk")}
    return MonthlyCost(
        lines=tuple(lines), usd_low=sum(l.usd_low for l in monthly), usd_high=sum(l.usd_high for l in monthly),
        categories=categories, pricing_date=book.newest_date(keys),
        always_on_usd_low=sum(l.usd_high if l.key in workers else l.usd_low for l in monthly),
        always_on_usd_high=sum(l.usd_high for l in monthly),
    )


def chat_scenario(name: str, tokens_per_second: float, daily_cost_usd: float, output_tokens_per_chat: int) -> ChatScenario:
    if tokens_per_second <= 0:
        raise ValueError(f"scenario {name!r}: tokens per second must be > 0, got {tokens_per_second}")
    tokens_per_day = tokens_per_second * SECONDS_PER_DAY
    conversations = tokens_per_day / output_tokens_per_chat
    return ChatScenario(
        name=name, tokens_per_second=tokens_per_second, tokens_per_day=tokens_per_day,
        conversations_per_day=conversations, daily_cost_usd=daily_cost_usd,
        usd_per_chat=daily_cost_usd / conversations,
    )


def chat_scenarios(monthly: MonthlyCost, chat: ChatAssumptions, output_tokens_per_chat: int,
                   measured_tokens_per_second: float | None = None) -> list[ChatScenario]:
    """Seed 000's scenarios for the given throughputs, plus the measured one when evaluation ran."""
    daily = monthly.usd_high / chat.days_per_month
    rates: list[tuple[str, float]] = [(f"tps_{_slug(f'{t:g}')}", t) for t in chat.tokens_per_second]
    if measured_tokens_per_second:
        rates.append(("measured", measured_tokens_per_second))
    return [chat_scenario(name, tps, daily, output_tokens_per_chat) for name, tps in rates]


def worker_node_hourly_usd(worker: WorkerSet, book: PriceBook) -> float:
    """One node of a worker set for an hour it exists: its compute and its boot disk (the month's price / 730)."""
    disk = book.get(f"disk.{worker.boot_disk.type}").usd * worker.boot_disk.size_gib / HOURS_PER_MONTH
    return node_price(worker.platform, worker.preset, book, preemptible=worker.preemptible).usd_per_hour + disk


def training_run(size: TrainingSize, cost: StageCost) -> TrainingRun:
    """The training run as the run's plan sizes and prices it (planning.planner.train_cost: its wall hours on the
    planned GPUs and their price); GPU-hours are those hours on every GPU; None where the plan has no hours, and no
    cost where the workers have no price (an existing cluster)."""
    return TrainingRun(tokens=size.tokens, epochs=size.epochs, tokens_per_second_per_gpu=size.tokens_per_second_per_gpu,
                       throughput_source=size.throughput_source, throughput_kind=size.throughput_kind, gpus=cost.gpus,
                       gpu_hours=cost.hours * cost.gpus if cost.hours is not None else None, wall_hours=cost.hours,
                       usd=cost.usd)
