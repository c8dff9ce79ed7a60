"""Pure functions: typed stack outputs (+ stack config, + the latest stored run) -> what the dashboard shows.

Cost lines carry their own category, label, quantity and unit price, so nothing is recomputed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from documents.evaluator_report import EvaluatorReport
from documents.metrics import MetricsRecord
from documents.run_record import RunIndex
from documents.stack_outputs import (
    IDENTITY,
    MEASURED,
    PLATFORM_FACTS,
    SIDES,
    Cost,
    EvalSide,
    Pipeline,
    Platform,
    Serving,
    StackOutputs,
    flat_name,
)
from infra.monitoring.view import JobMetricsView
from infra.output_sections import EVAL_FIGURES

CATEGORY_LABELS = {
    "compute": "Compute",
    "boot_disks": "Boot disks",
    "volumes": "Volumes",
    "shared_fs": "Shared filesystems",
    "object_storage": "Object storage",
    "networking": "Networking",
    "one_off": "Paid once (not monthly)",
}

@dataclass(frozen=True)
class CostRow:
    key: str
    label: str
    category: str
    usd_low: float
    usd_high: float
    quantity: str = ""
    unit_price: str = ""


@dataclass(frozen=True)
class ChatRow:
    name: str
    label: str
    tokens_per_second: float | None
    conversations_per_day: float | None
    usd_per_chat: float | None


@dataclass(frozen=True)
class AdapterRow:
    """One adapter the stack's server serves: its run, measured speed and cost per chat at that speed."""

    name: str
    run_id: str
    tokens_per_second: float | None
    time_to_first_token_s: float | None
    usd_per_chat: float | None


@dataclass(frozen=True)
class JobRow:
    stage: str
    job_id: str
    state: str
    duration_s: float | None


@dataclass(frozen=True)
class NodeRow:
    role: str
    platform: str
    preset: str
    count: str
    gpus: int | None
    boot_disk: str


@dataclass(frozen=True)
class FilesystemRow:
    name: str
    mount_path: str
    size_gib: int | None


@dataclass(frozen=True)
class EvalTable:
    metrics: list[tuple[str, float | None, float | None, float | None]]
    """(metric, base, fine-tuned, change % = (fine-tuned - base) / base)."""
    samples: list[dict[str, str]]
    data: list[tuple[str, int, int, int, str, float]] = field(default_factory=list)
    """tokenize losses per split: (split, rows read, kept, truncated, dropped by reason, lost %)."""


@dataclass(frozen=True)
class StoredRun:
    """One run from the run store: its index, training metrics and evaluator report."""

    index: RunIndex
    metrics: list[MetricsRecord]
    evaluator: EvaluatorReport | None


@dataclass
class DashboardData:
    stack: str
    target: str
    pricing_date: str | None = None
    monthly_low: float | None = None
    monthly_high: float | None = None
    always_on_low: float | None = None
    always_on_high: float | None = None
    """every worker up all month (seed 000's table); the monthly range above is the elastic one"""
    utilization_usd: float | None = None
    """the month at the node-hours the runs measured (elastic workers)"""
    categories: list[CostRow] = field(default_factory=list)
    lines: list[CostRow] = field(default_factory=list)
    chats: list[ChatRow] = field(default_factory=list)
    adapters: list[AdapterRow] = field(default_factory=list)
    training: dict[str, float] = field(default_factory=dict)
    training_source: str | None = None
    """which throughput priced the training run, and where it was measured."""
    training_kind: str | None = None
    """measured, borrowed, estimated or configured: shown beside the training cost."""
    nodes: list[NodeRow] = field(default_factory=list)
    filesystems: list[FilesystemRow] = field(default_factory=list)
    jobs: list[JobRow] = field(default_factory=list)
    run_id: str | None = None
    loss_curve: list[tuple[float, float]] = field(default_factory=list)
    eval_loss_curve: list[tuple[float, float]] = field(default_factory=list)
    comparison: EvalTable | None = None
    job_metrics: JobMetricsView | None = None
    other_outputs: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def humanize(key: str) -> str:
    text = key.replace("_", " ").strip()
    return text[:1].upper() + text[1:]


def chat_label(name: str, tokens_per_second: float | None) -> str:
    if name == MEASURED:
        return "Measured (fine-tuned model)"
    return f"{tokens_per_second:g} tokens/s" if tokens_per_second is not None else humanize(name)


def _category_order(category: str) -> int:
    order = list(CATEGORY_LABELS)
    return order.index(category) if category in order else len(order)


def cost_rows(cost: Cost) -> tuple[list[CostRow], list[CostRow]]:
    """Per-category and per-line rows (low/high, and each line's own category, label, quantity, unit price)."""
    category_rows = [CostRow(name, CATEGORY_LABELS.get(name, humanize(name)), name, c.usd_low, c.usd_high)
                     for name, c in cost.categories.items()]
    line_rows = [CostRow(name, line.label, line.category, line.usd_low, line.usd_high, line.quantity, line.unit_price)
                 for name, line in cost.lines.items()]
    category_rows.sort(key=lambda r: (_category_order(r.category), r.key))
    line_rows.sort(key=lambda r: (_category_order(r.category), -r.usd_high, r.key))
    return category_rows, line_rows


def chat_rows(cost: Cost) -> list[ChatRow]:
    rows = [ChatRow(name, chat_label(name, c.tokens_per_second), c.tokens_per_second, c.conversations_per_day, c.usd)
            for name, c in cost.chats.items()]
    return sorted(rows, key=lambda r: (r.name == MEASURED, r.tokens_per_second or 0.0))


def adapter_rows(serving: Serving | None) -> list[AdapterRow]:
    """The served adapters, in the server's order."""
    return [AdapterRow(name, a.run_id, a.tokens_per_second, a.time_to_first_token_s, a.usd_per_chat)
            for name, a in (serving.adapters if serving is not None else {}).items()]


def training_figures(cost: Cost) -> dict[str, float]:
    """The training run's figures that are known (source text aside)."""
    if cost.training is None:
        return {}
    return {name: float(value) for name, value in cost.training.model_dump(exclude={"throughput_source", "throughput_kind"}).items()
            if value is not None}


def job_rows_from_outputs(pipeline: Pipeline | None) -> list[JobRow]:
    if pipeline is None:
        return []
    return [JobRow(stage, job.job_id or "-", job.state or "unknown", job.elapsed_s) for stage, job in pipeline.jobs.items()]


def job_rows_from_run(index: RunIndex) -> list[JobRow]:
    return [JobRow(stage, str(job), index.job_states.get(stage, "unknown"), index.job_durations_s.get(stage))
            for stage, job in index.job_ids.items()]


def node_rows(platform: Platform | None) -> list[NodeRow]:
    """One row per node group; workers first."""
    rows = []
    for name, group in (platform.node_groups if platform is not None else {}).items():
        low, high = group.nodes, group.max_nodes
        count = str(low) if high == low else f"{low}-{high}"
        rows.append(NodeRow(name, group.platform, group.preset or "-", count, group.gpus_per_node,
                            f"{group.boot_disk_gib} GiB"))
    return sorted(rows, key=lambda r: (not (r.gpus or 0), r.role))


def filesystem_rows(platform: Platform | None, mount_paths: Mapping[str, str] | None = None) -> list[FilesystemRow]:
    """One row per filesystem; mount paths from the stack config where known."""
    paths = mount_paths or {}
    rows = []
    for tag, filesystem in (platform.filesystems if platform is not None else {}).items():
        name = tag.removeprefix("jail_submount_")
        default = "/ (jail root)" if tag == "jail" else "-"
        rows.append(FilesystemRow(name, paths.get(tag, default), filesystem.size_gib))
    return rows


def mount_paths(stack_config: Any) -> dict[str, str]:
    """Flat filesystem tag -> mount path inside the jail, from the stack config's submounts."""
    filesystems = getattr(stack_config, "filesystems", None)
    if filesystems is None:
        return {}
    return {flat_name(f"jail_submount_{s.name}"): s.mount_path for s in filesystems.submounts}


def loss_curves(records: Sequence[MetricsRecord]) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(step, train loss) and (step, eval loss) points of a run's metrics records."""
    train = [(float(r.step), r.loss) for r in records if r.loss is not None]
    evaluation = [(float(r.step), r.eval_loss) for r in records if r.eval_loss is not None]
    return train, evaluation


_COMPARED = (
    ("perplexity", "Perplexity (lower is better)"),
    ("tokens_per_second", "Generation speed (tokens/s)"),
    ("time_to_first_token", "Time to first token (s)"),
    ("message_length_avg", "Average reply length (chars)"),
    ("rouge_l", "ROUGE-L"),
    ("bleu", "BLEU"),
    ("chrf", "chrF"),
    ("exact_match", "Exact match (%)"),
    ("numeric_match", "Numeric match (%)"),
)
"""SideReport field -> label, in the order the page shows them."""
_COUNTED = {"rouge_l": "prompts_scored", "exact_match": "prompts_scored", "numeric_match": "numeric_scored"}
"""SideReport field -> the field counting the prompts behind it, shown in the label."""


def data_rows(report: EvaluatorReport) -> list[tuple[str, int, int, int, str, float]]:
    """The report's `data` block: where the rows of each split went when it was tokenized."""
    rows = []
    for split, losses in (report.data or {}).items():
        text = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in losses.dropped.items() if n) or "none"
        rows.append((split, losses.rows_read, losses.rows_kept, losses.truncated, text, 100.0 * losses.lost_fraction))
    return rows


def _comparison_rows(figures: Mapping[str, tuple[float | None, float | None]],
                     counts: Mapping[str, int | None] | None = None
                     ) -> list[tuple[str, float | None, float | None, float | None]]:
    rows = []
    for field_name, label in _COMPARED:
        b, t = figures.get(field_name, (None, None))
        if b is None and t is None:
            continue
        if (n := (counts or {}).get(field_name)) is not None:
            label = f"{label}, n={n}"
        delta = (t - b) / b * 100.0 if b not in (None, 0) and t is not None else None
        rows.append((label, b, t, delta))
    return rows


def comparison(report: EvaluatorReport | None) -> EvalTable | None:
    """Base vs fine-tuned figures and the fine-tuned side's first sample generations, from the report."""
    if report is None:
        return None
    figures = {f: (getattr(report.base_model, f), getattr(report.finetuned_model, f)) for f, _ in _COMPARED}
    counts = {f: getattr(report.finetuned_model, n) for f, n in _COUNTED.items()}
    samples = [s.model_dump() for s in report.finetuned_model.sample_generations[:3]]
    return EvalTable(_comparison_rows(figures, counts), samples, data_rows(report))


def comparison_from_outputs(pipeline: Pipeline | None) -> EvalTable | None:
    """The comparison from the outputs' evaluation figures (None when none has a value)."""
    if pipeline is None or pipeline.evaluation is None:
        return None
    base, tuned = (pipeline.evaluation.get(side) or EvalSide() for side in SIDES)
    figures = {field: (getattr(base, figure), getattr(tuned, figure)) for figure, field in EVAL_FIGURES.items()}
    rows = _comparison_rows(figures)
    return EvalTable(rows, []) if rows else None


def other_outputs(outputs: StackOutputs) -> dict[str, Any]:
    """What the page lists as plain facts: the stack's identity, the platform's facts, buckets, how to reach the
    monitoring dashboards, the bundle hash."""
    facts: dict[str, Any] = {field: getattr(outputs, field) for field in IDENTITY if field not in ("stack", "target")}
    if outputs.platform is not None:
        facts |= {fact: getattr(outputs.platform, fact) for fact in PLATFORM_FACTS}
        facts |= {f"{kind}_bucket_name": name for kind, name in outputs.platform.buckets.items()}
    if outputs.monitoring is not None:
        facts |= outputs.monitoring.flat()
    if outputs.pipeline is not None:
        facts["pipeline_bundle_hash"] = outputs.pipeline.bundle_hash
    return dict(sorted(facts.items()))


def build(stack_name: str, outputs: StackOutputs | None, stack_config: Any = None, run: StoredRun | None = None
          ) -> DashboardData:
    """Everything the page shows; without outputs, only what the stored run has."""
    data = DashboardData(stack=stack_name,
                         target=outputs.target if outputs else str(getattr(stack_config, "target", "?")))
    if outputs is not None:
        categories, lines = cost_rows(outputs.cost)
        if all(r.usd_high == 0 for r in categories + lines):
            categories, lines = [], []
        data.pricing_date = outputs.cost.pricing_date
        data.monthly_low, data.monthly_high = outputs.cost.monthly_usd_low, outputs.cost.monthly_usd_high
        data.always_on_low, data.always_on_high = outputs.cost.always_on_usd_low, outputs.cost.always_on_usd_high
        data.utilization_usd = outputs.cost.utilization.usd if outputs.cost.utilization else None
        data.categories, data.lines = categories, lines
        data.chats = chat_rows(outputs.cost)
        data.adapters = adapter_rows(outputs.serving)
        data.training = training_figures(outputs.cost)
        data.training_source = outputs.cost.training.throughput_source if outputs.cost.training else None
        data.training_kind = outputs.cost.training.throughput_kind if outputs.cost.training else None
        data.nodes = node_rows(outputs.platform)
        data.filesystems = filesystem_rows(outputs.platform, mount_paths(stack_config))
        data.jobs = job_rows_from_outputs(outputs.pipeline)
        data.other_outputs = other_outputs(outputs)
    if run is not None:
        data.run_id = run.index.run_id
        if not data.jobs and run.index.job_ids:
            data.jobs = job_rows_from_run(run.index)
        data.loss_curve, data.eval_loss_curve = loss_curves(run.metrics)
        data.comparison = comparison(run.evaluator)
    if data.comparison is None and outputs is not None:
        data.comparison = comparison_from_outputs(outputs.pipeline)
    return data
