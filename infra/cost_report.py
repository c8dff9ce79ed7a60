"""A stack's cost report: gathers what the pure model in ``infra/cost.py`` needs (run config, dataset
tokens, measured throughputs), returns the flat stack outputs and renders the table ``ftstack plan`` prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from infra import catalog
from infra.config import StackConfig
from infra.cost import (
    ChatScenario,
    MonthlyCost,
    TrainingRun,
    chat_scenarios,
    flat_outputs,
    monthly_cost,
    training_run,
    worker_gpus,
    workers_hourly_usd,
)
from infra.pricing import PriceBook

REPO_ROOT = Path(__file__).resolve().parent.parent
_TPS_KEYS = ("train_tokens_per_second_per_gpu", "tokens_per_second_per_gpu")
_TOTAL_TPS_KEYS = ("train_tokens_per_second", "tokens_per_second")


class CostReport(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    monthly: MonthlyCost
    training: TrainingRun | None
    chats: list[ChatScenario]
    notes: list[str]

    def outputs(self) -> dict[str, float | str]:
        return flat_outputs(self.monthly, self.training, self.chats)


def load_run(cfg: StackConfig, root: Path = REPO_ROOT) -> Any | None:
    """The stack's run config, or None where it is not readable here."""
    from workloads.config import load_run_config

    path = Path(cfg.pipeline.run_config)
    path = path if path.is_absolute() else root / path
    return load_run_config(path) if path.is_file() else None


def tokenized_tokens(tokenized_dir: Path) -> int | None:
    """Sum of the ``length`` column of a ``datasets.save_to_disk`` folder, read with pyarrow."""
    import pyarrow as pa

    files = sorted(tokenized_dir.glob("*.arrow")) if tokenized_dir.is_dir() else []
    if not files:
        return None
    total = 0
    for file in files:
        with pa.memory_map(str(file)) as source:
            table = pa.ipc.open_stream(source).read_all()
        if "length" not in table.column_names:
            return None
        total += int(pa.compute.sum(table["length"]).as_py() or 0)
    return total


def last_metric(metrics_file: Path, keys: tuple[str, ...]) -> float | None:
    """The last value of any of ``keys`` in a JSON-lines metrics file."""
    if not metrics_file.is_file():
        return None
    value = None
    for line in metrics_file.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        for key in keys:
            if isinstance(record, dict) and isinstance(record.get(key), (int, float)) and record[key] > 0:
                value = float(record[key])
    return value


def measured_generation_tps(results_dir: Path) -> float | None:
    """Fine-tuned model's generation tokens/s from the newest evaluator_<job>.json, when evaluation ran."""
    files = sorted(results_dir.glob("evaluator_*.json"), key=lambda p: p.stat().st_mtime) if results_dir.is_dir() else []
    for file in reversed(files):
        try:
            doc = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        model = doc.get("finetuned_model", {}) if isinstance(doc, dict) else {}
        for key in ("tokens_per_second", "generation_tokens_per_second", "tokens_per_sec"):
            value = model.get(key)
            if isinstance(value, (int, float)) and value > 0:
                return float(value)
    return None


def _train_field(train: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if train is not None and getattr(train, name, None) is not None:
            return getattr(train, name)
    return default


def _measured(cfg: StackConfig, run: Any) -> tuple[float | None, str]:
    """Benchmark throughput recorded for the workers' GPU model, this model and method (infra/throughput.py)."""
    from infra.throughput import measured_throughput
    from workloads.train.memory import inputs_from_run

    if cfg.nodes is None or getattr(run, "train", None) is None:
        return None, "unknown"
    method = inputs_from_run(run).method
    for worker in cfg.nodes.workers:
        gpu = catalog.get_platform(worker.platform).gpu_model
        figure = measured_throughput(gpu, run.model.source, method) if gpu else None
        if figure is not None:
            return figure.tokens_per_second_per_gpu, f"measured on {figure.device}, {figure.date} ({figure.source})"
    return None, "unknown"


def training_estimate(cfg: StackConfig, run: Any, book: PriceBook, notes: list[str]) -> TrainingRun | None:
    if run is None:
        notes.append(f"training run: run config {cfg.pipeline.run_config} not found here")
        return None
    train = getattr(run, "train", None)
    epochs = float(_train_field(train, "epochs", "num_train_epochs", default=1))
    tokens = tokenized_tokens(run.train_tokenized_dir)
    if tokens is None and run.data.rows is None:
        notes.append("training run: dataset size unknown (no tokenized dataset here and data.rows unset)")
        return None
    if tokens is None:
        rows = run.data.rows * run.data.split_ratio
        per_row = cfg.pricing.training.avg_tokens_per_row or run.data.max_length
        tokens = rows * per_row
        basis = "tokens/row from pricing.training.avgTokensPerRow" if cfg.pricing.training.avg_tokens_per_row \
            else "data.max_length tokens/row (upper bound)"
        notes.append(f"training tokens: {rows:g} train rows x {per_row:g} ({basis})")
    tps, source = cfg.pricing.training.tokens_per_second_per_gpu, "pricing.training.tokensPerSecondPerGpu"
    if tps is None:
        metrics = run.train_run_dir / "metrics.jsonl"
        tps, source = last_metric(metrics, _TPS_KEYS), f"{metrics}"
    if tps is None:
        tps, source = _measured(cfg, run)
    if tps is None:
        notes.append("training run: no throughput (set pricing.training.tokensPerSecondPerGpu or run training once)")
        source = "unknown"
    return training_run(tokens, epochs, tps, source, worker_gpus(cfg), workers_hourly_usd(cfg, book))


def cost_report(cfg: StackConfig, root: Path = REPO_ROOT) -> CostReport:
    """Monthly TCO, training-run cost and cost per chat of a stack."""
    book = PriceBook(cfg.pricing.overrides)
    monthly = monthly_cost(cfg, cfg.pricing, book)
    notes = [line.note and f"{line.label}: {line.note}" for line in monthly.lines if line.note]
    run = load_run(cfg, root)
    training = training_estimate(cfg, run, book, notes) if cfg.target == "nebius" else None
    measured = measured_generation_tps(run.results_dir) if run is not None else None
    chats = chat_scenarios(monthly, cfg.pricing.chat, measured) if monthly.usd_high > 0 else []
    return CostReport(monthly=monthly, training=training, chats=chats, notes=[n for n in notes if n])


def _usd(low: float, high: float) -> str:
    return f"${low:,.0f}" if round(low) == round(high) else f"${low:,.0f} to ${high:,.0f}"


def render_table(report: CostReport) -> str:
    m = report.monthly
    if not m.lines:
        return "Monthly cost: $0 (no cloud resources on this stack)"
    rows = [("Resource", "Size", "Price", "Monthly")]
    for line in m.lines:
        rows.append((line.label, line.quantity, line.unit_price, _usd(line.usd_low, line.usd_high)))
    rows.append(("Total monthly cost", "", f"{m.hours_per_month} h/month", _usd(m.usd_low, m.usd_high)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    fmt = lambda r: "  " + "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    out = [f"Monthly cost (prices as of {m.pricing_date}; see infra/pricing.py for sources):", fmt(rows[0])]
    out += [fmt(r) for r in rows[1:]]
    cats = ", ".join(f"{c} {_usd(lo, hi)}" for c, (lo, hi) in m.categories.items() if hi > 0)
    out.append(f"  by category: {cats}")
    t = report.training
    if t is not None:
        out.append("")
        if t.usd is None:
            out.append(f"Training run: {t.tokens * t.epochs:,.0f} tokens; throughput unknown, no cost estimate")
        else:
            out.append(f"Training run: {t.tokens * t.epochs:,.0f} tokens at {t.tokens_per_second_per_gpu:g} tokens/s/GPU "
                       f"({t.throughput_source}) = {t.gpu_hours:,.1f} GPU-hours, {t.wall_hours:,.1f} h on "
                       f"{t.gpus} GPUs, ${t.usd:,.2f}")
    if report.chats:
        out += ["", render_chat_table(report.chats)]
    if report.notes:
        out += ["", *[f"note: {n}" for n in report.notes]]
    return "\n".join(out)


def render_chat_table(chats: list[ChatScenario]) -> str:
    """Seed 000's cost-per-chat table: throughput, tokens and conversations per day, cost per chat."""
    out = ["Cost per chat (daily cost = monthly high / days per month):",
           "  Scenario        Tokens/s   Tokens/day  Conversations/day  Cost/chat"]
    for s in chats:
        out.append(f"  {s.name:<14}{s.tokens_per_second:>9g}{s.tokens_per_day:>13,.0f}"
                   f"{s.conversations_per_day:>19,.0f}  ${s.usd_per_chat:.2f}")
    return "\n".join(out)


def report_document(report: CostReport) -> dict[str, Any]:
    """JSON form for ``ftstack plan --json``: lines, categories, totals, training run, scenarios."""
    return {
        "monthly": report.monthly.model_dump(),
        "training_run": report.training.model_dump() if report.training else None,
        "cost_per_chat": [s.model_dump() for s in report.chats],
        "notes": report.notes,
    }
