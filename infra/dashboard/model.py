"""Pure functions: stack outputs (+ stack config, + the latest stored run) -> what the dashboard shows.

Output keys are read through the patterns of ``infra/outputs.py``; cost lines carry their own category,
label, quantity and unit price, so nothing is recomputed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra import outputs as keys
from infra.artifacts import RunIndex
from workloads.eval.report import EvaluatorReport
from workloads.train.metrics import MetricsRecord

CATEGORY_LABELS = {
    "compute": "Compute",
    "boot_disks": "Boot disks",
    "volumes": "Volumes",
    "shared_fs": "Shared filesystems",
    "object_storage": "Object storage",
    "networking": "Networking",
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
class Comparison:
    metrics: list[tuple[str, float | None, float | None, float | None]]
    """(metric, base, fine-tuned, change % = (fine-tuned - base) / base)."""
    samples: list[dict[str, str]]
    data: list[tuple[str, int, int, int, str, float]] = field(default_factory=list)
    """tokenize losses per split: (split, rows read, kept, truncated, dropped by reason, lost %)."""


@dataclass(frozen=True)
class StoredRun:
    """One run from the artifacts store: its index, training metrics and evaluator report."""

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
    categories: list[CostRow] = field(default_factory=list)
    lines: list[CostRow] = field(default_factory=list)
    chats: list[ChatRow] = field(default_factory=list)
    training: dict[str, float] = field(default_factory=dict)
    nodes: list[NodeRow] = field(default_factory=list)
    filesystems: list[FilesystemRow] = field(default_factory=list)
    jobs: list[JobRow] = field(default_factory=list)
    run_id: str | None = None
    loss_curve: list[tuple[float, float]] = field(default_factory=list)
    eval_loss_curve: list[tuple[float, float]] = field(default_factory=list)
    comparison: Comparison | None = None
    other_outputs: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def unwrap_outputs(document: Any, source: str = "outputs") -> dict[str, Any]:
    """Accept `pulumi stack output --json` (a flat object) or a document with an `outputs` object."""
    if isinstance(document, Mapping) and isinstance(document.get("outputs"), Mapping):
        document = document["outputs"]
    if not isinstance(document, Mapping):
        raise ValueError(f"{source}: expected a JSON object of stack outputs, got {type(document).__name__}")
    return dict(document)


def humanize(key: str) -> str:
    text = key.replace("_", " ").strip()
    return text[:1].upper() + text[1:]


def chat_label(name: str, tokens_per_second: float | None) -> str:
    if name == keys.MEASURED:
        return "Measured (fine-tuned model)"
    return f"{tokens_per_second:g} tokens/s" if tokens_per_second is not None else humanize(name)


def cost_rows(outputs: Mapping[str, Any]) -> tuple[list[CostRow], list[CostRow]]:
    """Per-category and per-line rows (low/high, and each line's own category, label, quantity, unit price)."""
    categories: dict[str, dict[str, float]] = {}
    lines: dict[str, dict[str, Any]] = {}
    for key, value in outputs.items():
        if (match := keys.CATEGORY.match(key)) and (number := _num(value)) is not None:
            categories.setdefault(match["name"], {})[match["bound"]] = number
        elif match := keys.LINE.match(key):
            lines.setdefault(match["name"], {})[match["field"]] = value
    category_rows = [
        CostRow(name, CATEGORY_LABELS.get(name, humanize(name)), name, *_bounds(b.get("low"), b.get("high")))
        for name, b in categories.items()
    ]
    line_rows = [
        CostRow(name, str(f.get("label") or humanize(name)), str(f.get("category") or "other"),
                *_bounds(_num(f.get("usd_low")), _num(f.get("usd_high"))),
                str(f.get("quantity") or ""), str(f.get("unit_price") or ""))
        for name, f in lines.items() if _num(f.get("usd_low")) is not None or _num(f.get("usd_high")) is not None
    ]
    order = list(CATEGORY_LABELS)
    category_rows.sort(key=lambda r: (order.index(r.category) if r.category in order else len(order), r.key))
    line_rows.sort(key=lambda r: (order.index(r.category) if r.category in order else len(order), -r.usd_high, r.key))
    return category_rows, line_rows


def _bounds(low: float | None, high: float | None) -> tuple[float, float]:
    low = low if low is not None else (high if high is not None else 0.0)
    return low, high if high is not None else low


def chat_rows(outputs: Mapping[str, Any]) -> list[ChatRow]:
    found: dict[str, dict[str, float | None]] = {}
    for key, value in outputs.items():
        if match := keys.CHAT.match(key):
            found.setdefault(match["name"], {})[match["field"]] = _num(value)
    rows = [
        ChatRow(name, chat_label(name, f.get("tokens_per_second")), f.get("tokens_per_second"), f.get("conversations_per_day"), f.get("usd"))
        for name, f in found.items()
    ]
    return sorted(rows, key=lambda r: (r.name == keys.MEASURED, r.tokens_per_second or 0.0))


def training_figures(outputs: Mapping[str, Any]) -> dict[str, float]:
    return {m["field"]: n for k, v in outputs.items() if (m := keys.TRAINING.match(k)) and (n := _num(v)) is not None}


def job_rows_from_outputs(outputs: Mapping[str, Any]) -> list[JobRow]:
    found: dict[str, dict[str, Any]] = {}
    for key, value in outputs.items():
        if match := keys.JOB.match(key):
            found.setdefault(match["stage"], {})[match["field"]] = value
    return [
        JobRow(stage, str(f.get("job_id") or "-"), str(f.get("state") or "unknown"), _num(f.get("elapsed_s")))
        for stage, f in found.items()
    ]


def job_rows_from_run(index: RunIndex) -> list[JobRow]:
    return [JobRow(stage, str(job), index.job_states.get(stage, "unknown"), index.job_durations_s.get(stage))
            for stage, job in index.job_ids.items()]


def node_rows(outputs: Mapping[str, Any]) -> list[NodeRow]:
    """One row per node group (`node_group_<name>_*`); workers first."""
    rows = []
    for name in keys.names(outputs, keys.NODE_GROUP_PREFIX, "platform"):
        get = lambda field: outputs.get(keys.node_group_key(name, field))  # noqa: E731
        low, high = get("nodes"), get("max_nodes")
        count = "-" if low is None else str(low) if high in (None, low) else f"{low}-{high}"
        gpus = _num(get("gpus_per_node"))
        disk = get("boot_disk_gib")
        rows.append(NodeRow(name, str(get("platform")), str(get("preset") or "-"), count,
                            None if gpus is None else int(gpus), "-" if disk is None else f"{disk} GiB"))
    return sorted(rows, key=lambda r: (not (r.gpus or 0), r.role))


def filesystem_rows(outputs: Mapping[str, Any], mount_paths: Mapping[str, str] | None = None) -> list[FilesystemRow]:
    """One row per filesystem (`filesystem_<tag>_*`); mount paths from the stack config where known."""
    paths = mount_paths or {}
    rows = []
    for tag in keys.names(outputs, keys.FILESYSTEM_PREFIX, "size_gib"):
        size = _num(outputs.get(keys.filesystem_key(tag, "size_gib")))
        name = tag.removeprefix("jail_submount_")
        default = "/ (jail root)" if tag == "jail" else "-"
        rows.append(FilesystemRow(name, paths.get(tag, default), None if size is None else int(size)))
    return rows


def mount_paths(stack_config: Any) -> dict[str, str]:
    """Flat filesystem tag -> mount path inside the jail, from the stack config's submounts."""
    filesystems = getattr(stack_config, "filesystems", None)
    if filesystems is None:
        return {}
    return {keys.flat_name(f"jail_submount_{s.name}"): s.mount_path for s in filesystems.submounts}


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


def comparison(report: EvaluatorReport | None) -> Comparison | None:
    """Base vs fine-tuned figures and the fine-tuned side's first sample generations, from the report."""
    if report is None:
        return None
    figures = {f: (getattr(report.base_model, f), getattr(report.finetuned_model, f)) for f, _ in _COMPARED}
    counts = {f: getattr(report.finetuned_model, n) for f, n in _COUNTED.items()}
    samples = [s.model_dump() for s in report.finetuned_model.sample_generations[:3]]
    return Comparison(_comparison_rows(figures, counts), samples, data_rows(report))


def comparison_from_outputs(outputs: Mapping[str, Any]) -> Comparison | None:
    """The comparison from the flat `eval_<figure>_<side>` outputs (None when none has a value)."""
    figures: dict[str, list[float | None]] = {}
    for key, value in outputs.items():
        if (match := keys.EVAL.match(key)) and (number := _num(value)) is not None:
            pair = figures.setdefault(keys.EVAL_FIGURES[match["figure"]], [None, None])
            pair[keys.SIDES.index(match["side"])] = number
    rows = _comparison_rows({f: (b, t) for f, (b, t) in figures.items()})
    return Comparison(rows, []) if rows else None


_KNOWN = (keys.CATEGORY, keys.LINE, keys.CHAT, keys.TRAINING, keys.JOB, keys.EVAL)
_SHOWN_ELSEWHERE = (keys.MONTHLY_LOW, keys.MONTHLY_HIGH, keys.PRICING_DATE, keys.HOURS_PER_MONTH)


def build(stack: str, outputs: Mapping[str, Any], stack_config: Any = None, run: StoredRun | None = None) -> DashboardData:
    """Everything the page shows."""
    categories, lines = cost_rows(outputs)
    if all(r.usd_high == 0 for r in categories + lines):
        categories, lines = [], []
    data = DashboardData(
        stack=stack,
        target=str(outputs.get("target") or getattr(stack_config, "target", "?")),
        pricing_date=outputs.get(keys.PRICING_DATE),
        monthly_low=_num(outputs.get(keys.MONTHLY_LOW)),
        monthly_high=_num(outputs.get(keys.MONTHLY_HIGH)),
        categories=categories,
        lines=lines,
        chats=chat_rows(outputs),
        training=training_figures(outputs),
        nodes=node_rows(outputs),
        filesystems=filesystem_rows(outputs, mount_paths(stack_config)),
        jobs=job_rows_from_outputs(outputs),
        other_outputs={
            k: v for k, v in sorted(outputs.items())
            if not any(p.match(k) for p in _KNOWN) and k not in _SHOWN_ELSEWHERE
            and not k.startswith((keys.NODE_GROUP_PREFIX, keys.FILESYSTEM_PREFIX))
        },
    )
    if run is not None:
        data.run_id = run.index.run_id
        if not data.jobs and run.index.job_ids:
            data.jobs = job_rows_from_run(run.index)
        data.loss_curve, data.eval_loss_curve = loss_curves(run.metrics)
        data.comparison = comparison(run.evaluator)
    if data.comparison is None:
        data.comparison = comparison_from_outputs(outputs)
    return data
