"""Pure functions: stack outputs (+ stack config, + the latest run's artifacts) -> what the dashboard shows."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CATEGORY_LABELS = {
    "compute": "Compute",
    "boot_disks": "Boot disks",
    "shared_fs": "Shared filesystems",
    "object_storage": "Object storage",
    "networking": "Networking",
}
_LINE_PREFIXES = (
    ("compute_", "compute"),
    ("boot_disk_", "boot_disks"),
    ("shared_fs_", "shared_fs"),
    ("object_storage_", "object_storage"),
    ("networking_", "networking"),
)
_CATEGORY = re.compile(r"^cost_category_(?P<name>.+)_usd_(?P<bound>low|high)$")
_LINE = re.compile(r"^cost_line_(?P<name>.+)_usd_(?P<bound>low|high)$")
_CHAT = re.compile(r"^cost_per_chat_(?P<name>.+)_(?P<field>tokens_per_second|conversations_per_day|usd)$")
_TRAINING = re.compile(r"^training_run_(?P<field>.+)$")
_JOB = re.compile(r"^pipeline_(?P<stage>[a-z0-9]+)_(?P<field>job_id|state|elapsed_s)$")
_EVAL = re.compile(r"^eval_(?P<metric>.+)_(?P<side>base|finetuned)$")
_EVAL_METRICS = {"time_to_first_token_s": "time_to_first_token"}


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


def line_category(key: str) -> str:
    return next((cat for prefix, cat in _LINE_PREFIXES if key.startswith(prefix)), "other")


def humanize(key: str) -> str:
    text = key.replace("_", " ").strip()
    return text[:1].upper() + text[1:]


def chat_label(name: str) -> str:
    match = re.fullmatch(r"tps_(\d+)(?:_(\d+))?", name)
    if match:
        number = match.group(1) + (f".{match.group(2)}" if match.group(2) else "")
        return f"{number} tokens/s"
    return humanize(name)


def cost_rows(outputs: Mapping[str, Any], line_details: Mapping[str, Mapping[str, str]] | None = None
              ) -> tuple[list[CostRow], list[CostRow]]:
    """Per-category and per-line rows (low/high) from the flat cost_* outputs."""
    details = line_details or {}
    found: dict[tuple[str, str], dict[str, float]] = {}
    for key, value in outputs.items():
        for kind, pattern in (("category", _CATEGORY), ("line", _LINE)):
            match = pattern.match(key)
            if match and (number := _num(value)) is not None:
                found.setdefault((kind, match["name"]), {})[match["bound"]] = number
    categories, lines = [], []
    for (kind, name), bounds in found.items():
        low = bounds.get("low", bounds.get("high", 0.0))
        high = bounds.get("high", low)
        if kind == "category":
            categories.append(CostRow(name, CATEGORY_LABELS.get(name, humanize(name)), name, low, high))
        else:
            info = details.get(name, {})
            lines.append(CostRow(
                name, info.get("label") or humanize(name.split("_", 1)[-1] if "_" in name else name),
                line_category(name), low, high, info.get("quantity", ""), info.get("unit_price", ""),
            ))
    order = list(CATEGORY_LABELS)
    categories.sort(key=lambda r: (order.index(r.category) if r.category in order else len(order), r.key))
    lines.sort(key=lambda r: (order.index(r.category) if r.category in order else len(order), -r.usd_high, r.key))
    return categories, lines


def chat_rows(outputs: Mapping[str, Any]) -> list[ChatRow]:
    found: dict[str, dict[str, float | None]] = {}
    for key, value in outputs.items():
        if match := _CHAT.match(key):
            found.setdefault(match["name"], {})[match["field"]] = _num(value)
    rows = [
        ChatRow(name, chat_label(name), f.get("tokens_per_second"), f.get("conversations_per_day"), f.get("usd"))
        for name, f in found.items()
    ]
    return sorted(rows, key=lambda r: (r.name == "measured", r.tokens_per_second or 0.0))


def training_figures(outputs: Mapping[str, Any]) -> dict[str, float]:
    return {m["field"]: n for k, v in outputs.items() if (m := _TRAINING.match(k)) and (n := _num(v)) is not None}


def job_rows_from_outputs(outputs: Mapping[str, Any]) -> list[JobRow]:
    found: dict[str, dict[str, Any]] = {}
    for key, value in outputs.items():
        if match := _JOB.match(key):
            found.setdefault(match["stage"], {})[match["field"]] = value
    return [
        JobRow(stage, str(f.get("job_id") or "-"), str(f.get("state") or "unknown"), _num(f.get("elapsed_s")))
        for stage, f in found.items()
    ]


def evaluator_from_outputs(outputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """An evaluator-shaped document from the flat `eval_<metric>_<side>` outputs (None when none has a value)."""
    sides: dict[str, dict[str, float]] = {"base_model": {}, "finetuned_model": {}}
    for key, value in outputs.items():
        if (match := _EVAL.match(key)) and (number := _num(value)) is not None:
            metric = _EVAL_METRICS.get(match["metric"], match["metric"])
            sides[f"{match['side']}_model"][metric] = number
    return sides if any(sides.values()) else None


def job_rows_from_run(job_ids: Mapping[str, str], states: Mapping[str, str],
                      durations: Mapping[str, float]) -> list[JobRow]:
    return [JobRow(stage, str(job), states.get(stage, "unknown"), durations.get(stage)) for stage, job in job_ids.items()]


NODE_GROUP_FIELDS = ("id", "platform", "preset", "nodes", "max_nodes", "gpus_per_node", "boot_disk_gib")
FILESYSTEM_FIELDS = ("id", "size_gib")


def _names(outputs: Mapping[str, Any], prefix: str, marker: str) -> list[str]:
    """Entity names of flat keys `<prefix><name>_<marker>`, in output order."""
    return [k[len(prefix):-len(marker) - 1] for k in outputs if k.startswith(prefix) and k.endswith("_" + marker)]


def node_rows(outputs: Mapping[str, Any]) -> list[NodeRow]:
    """One row per `node_group_<name>_*` group; workers first."""
    rows = []
    for name in _names(outputs, "node_group_", "platform"):
        get = lambda field: outputs.get(f"node_group_{name}_{field}")  # noqa: E731
        low, high = get("nodes"), get("max_nodes")
        count = "-" if low is None else str(low) if high in (None, low) else f"{low}-{high}"
        gpus = _num(get("gpus_per_node"))
        disk = get("boot_disk_gib")
        rows.append(NodeRow(name, str(get("platform")), str(get("preset") or "-"), count,
                            None if gpus is None else int(gpus), "-" if disk is None else f"{disk} GiB"))
    return sorted(rows, key=lambda r: (not (r.gpus or 0), r.role))


def filesystem_rows(outputs: Mapping[str, Any], mount_paths: Mapping[str, str] | None = None) -> list[FilesystemRow]:
    """One row per `filesystem_<tag>_*` filesystem; mount paths from the stack config where known."""
    paths = mount_paths or {}
    rows = []
    for tag in _names(outputs, "filesystem_", "size_gib"):
        size = _num(outputs.get(f"filesystem_{tag}_size_gib"))
        name = tag.removeprefix("jail_submount_")
        default = "/ (jail root)" if tag == "jail" else "-"
        rows.append(FilesystemRow(name, paths.get(tag, default), None if size is None else int(size)))
    return rows


def mount_paths(stack_config: Any) -> dict[str, str]:
    """Flat filesystem tag -> mount path inside the jail, from the stack config's submounts."""
    filesystems = getattr(stack_config, "filesystems", None)
    if filesystems is None:
        return {}
    return {f"jail_submount_{s.name.replace('-', '_')}": s.mount_path for s in filesystems.submounts}


def loss_curves(records: Sequence[Mapping[str, Any]]) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(step, train loss) and (step, eval loss) points from metrics.jsonl records."""
    train, evaluation = [], []
    for i, record in enumerate(records):
        step = _num(record.get("step", record.get("global_step", i)))
        step = float(i) if step is None else step
        if (loss := _num(record.get("loss", record.get("train_loss")))) is not None:
            train.append((step, loss))
        if (eval_loss := _num(record.get("eval_loss"))) is not None:
            evaluation.append((step, eval_loss))
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
_COUNTED = {"rouge_l": "prompts_scored", "exact_match": "prompts_scored", "numeric_match": "numeric_scored"}


def data_rows(evaluator: Mapping[str, Any]) -> list[tuple[str, int, int, int, str, float]]:
    """The evaluator report's `data` block: where the rows of each split went when it was tokenized."""
    rows = []
    for split, block in (evaluator.get("data") or {}).items():
        dropped = block.get("dropped") or {}
        text = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in dropped.items() if n) or "none"
        rows.append((split, int(block.get("rows_read", 0)), int(block.get("rows_kept", 0)),
                     int(block.get("truncated", 0)), text, 100.0 * float(block.get("lost_fraction", 0.0))))
    return rows


def comparison(evaluator: Mapping[str, Any] | None) -> Comparison | None:
    """Base vs fine-tuned figures from an evaluator JSON (base_model / finetuned_model / comparison)."""
    if not evaluator:
        return None
    base = evaluator.get("base_model") or {}
    tuned = evaluator.get("finetuned_model") or {}
    rows: list[tuple[str, float | None, float | None, float | None]] = []
    for key, label in _COMPARED:
        b, t = _num(base.get(key)), _num(tuned.get(key))
        if b is None and t is None:
            continue
        if (n := _num(tuned.get(_COUNTED.get(key, "")))) is not None:
            label = f"{label}, n={int(n)}"
        delta = (t - b) / b * 100.0 if b not in (None, 0) and t is not None else None
        rows.append((label, b, t, delta))
    samples = []
    for sample in (tuned.get("sample_generations") or [])[:3]:
        if isinstance(sample, Mapping):
            samples.append({k: str(sample.get(k, "")) for k in ("input", "reference", "generated")})
    return Comparison(rows, samples, data_rows(evaluator)) if rows or samples else None


_KNOWN = (_CATEGORY, _LINE, _CHAT, _TRAINING, _JOB, _EVAL)
_SHOWN_ELSEWHERE = ("cost_monthly_usd_low", "cost_monthly_usd_high", "cost_pricing_date", "cost_hours_per_month")


def build(
    stack: str,
    outputs: Mapping[str, Any],
    stack_config: Any = None,
    line_details: Mapping[str, Mapping[str, str]] | None = None,
    run: Mapping[str, Any] | None = None,
) -> DashboardData:
    """Everything the page shows. `run`: {"index": run.json dict, "metrics": [...], "evaluator": {...}}."""
    categories, lines = cost_rows(outputs, line_details)
    if all(r.usd_high == 0 for r in categories + lines):
        categories, lines = [], []
    data = DashboardData(
        stack=stack,
        target=str(outputs.get("target") or getattr(stack_config, "target", "?")),
        pricing_date=outputs.get("cost_pricing_date"),
        monthly_low=_num(outputs.get("cost_monthly_usd_low")),
        monthly_high=_num(outputs.get("cost_monthly_usd_high")),
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
            and not k.startswith(("node_group_", "filesystem_"))
        },
    )
    if run:
        index = run.get("index") or {}
        data.run_id = index.get("run_id")
        if not data.jobs and index.get("job_ids"):
            data.jobs = job_rows_from_run(index["job_ids"], index.get("job_states", {}), index.get("job_durations_s", {}))
        data.loss_curve, data.eval_loss_curve = loss_curves(run.get("metrics") or [])
        data.comparison = comparison(run.get("evaluator"))
    if data.comparison is None:
        data.comparison = comparison(evaluator_from_outputs(outputs))
    return data
