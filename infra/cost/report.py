"""A stack's cost report: gathers what the pure model in ``infra/cost/model.py`` needs (run config, dataset
tokens, the training throughput), returns the cost part of the stack outputs and renders the table ``ftstack plan`` prints.

The training throughput is never read from this machine at the run's paths (on a cluster stack those are the
cluster's): the caller passes what a run on the stack measured (``documents.throughput.measure_run``).

The ``measured`` cost-per-chat scenario is not here: it comes from the eval job's report
(``infra.program.outputs.measured_scenario``), on the stack that ran it, never from files on this machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from infra import catalog
from infra.config import StackConfig
from infra.pipeline.chain import worker_shape
from infra.cost.model import (
    ChatScenario,
    MonthlyCost,
    TrainingRun,
    chat_scenarios,
    monthly_cost,
    training_run,
    workers_hourly_usd,
)
from infra.program.outputs import cost_section
from documents.stack_outputs import Cost
from infra.cost.pricing import PriceBook
from documents.run_config import RunConfig
from workloads.train.batch_choice import planned_batching
from workloads.train.config import TrainConfig
from documents.prepare_summary import PrepareSummary
from documents.throughput import ThroughputMeasurement, bench_throughput

REPO_ROOT = Path(__file__).resolve().parents[2]


class CostReport(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    monthly: MonthlyCost
    training: TrainingRun | None
    chats: list[ChatScenario]
    notes: list[str]

    def section(self) -> Cost:
        """The cost part of the stack outputs."""
        return cost_section(self.monthly, self.training, self.chats)


def load_run(cfg: StackConfig, root: Path = REPO_ROOT) -> RunConfig | None:
    """The stack's run config, or None where it is not readable here."""
    from documents.run_config import load_run_config

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


def step_tokens(train: TrainConfig, gpus: int, tokens_per_row: float, max_length: int) -> float:
    """Tokens one optimizer step takes in: gradient accumulation x data-parallel ranks (one per GPU) x a
    micro-batch (packed, and `auto` before the data decides: micro_batch_size x max_length tokens at most;
    padded: micro_batch_size rows)."""
    packed = planned_batching(train.batching) == "packed"
    micro = train.micro_batch_size * (max_length if packed else tokens_per_row)
    return train.gradient_accumulation_steps * max(gpus, 1) * micro


def passes(train: TrainConfig | None, tokens: float, rows: float | None, gpus: int, max_length: int,
           notes: list[str]) -> float:
    """Passes over the data the run makes: `epochs`, or as far as `max_steps` reaches when it is set (the
    trainer stops at max_steps, inside the first epoch or after several)."""
    if train is None:
        return 1.0
    if train.max_steps is None:
        return float(train.epochs)
    per_step = step_tokens(train, gpus, tokens / rows if rows else max_length, max_length)
    epochs = train.max_steps * per_step / tokens
    notes.append(f"training run: max_steps {train.max_steps} x {per_step:,.0f} tokens/step = {epochs:.3g} "
                 f"passes over {tokens:,.0f} tokens")
    return epochs


def stack_gpu_model(cfg: StackConfig) -> str | None:
    """The catalog GPU model of the stack's workers (None for CPU workers or a stack without nodes)."""
    if cfg.nodes is None:
        return None
    return next((g for g in (catalog.get_platform(w.platform).gpu_model for w in cfg.nodes.workers) if g), None)


def choose_throughput(cfg: StackConfig, run: RunConfig, measured: ThroughputMeasurement | None,
                      notes: list[str]) -> tuple[float | None, str]:
    """The training throughput a stack is priced with and where it came from, in this order: the stack's
    pricing.training.tokensPerSecondPerGpu, a run measured on this stack, a bench figure for the workers' GPU
    model, this model and method (borrowed, and said so)."""
    if cfg.pricing.training.tokens_per_second_per_gpu is not None:
        return cfg.pricing.training.tokens_per_second_per_gpu, "pricing.training.tokensPerSecondPerGpu"
    if measured is not None:
        return measured.tokens_per_second_per_device, f"measured: {measured.describe()}"
    gpu = stack_gpu_model(cfg)
    method = run.train.method if run.train else None
    borrowed = bench_throughput(gpu, run.model.source, method) if gpu and method else None
    if borrowed is None:
        return None, "unknown"
    notes.append(f"training run: stack {cfg.stack!r} has no throughput measured by a run of its own; borrowed the "
                 f"bench figure {borrowed.describe()}")
    return borrowed.tokens_per_second_per_device, f"borrowed: {borrowed.describe()}"


def training_devices(cfg: StackConfig, measured: ThroughputMeasurement | None) -> int:
    """GPUs the train job spreads over (`worker_shape`, what its sbatch asks for); on workers without GPUs
    (an existing CPU cluster), the ranks the measured run had."""
    nodes, gpus_per_node = worker_shape(cfg)
    return nodes * gpus_per_node or (measured.devices if measured is not None else 0)


def prepared_tokens(prepared: PrepareSummary | None) -> tuple[int, int] | None:
    """Train rows and tokens the run's prepare stage kept (its prepare.json), when it recorded the mean length."""
    side = prepared.tokenized.get("train") if prepared is not None else None
    if side is None or side.mean_tokens is None:
        return None
    return side.rows_kept, round(side.rows_kept * side.mean_tokens)


def training_estimate(cfg: StackConfig, run: RunConfig | None, book: PriceBook, notes: list[str],
                      measured: ThroughputMeasurement | None = None, prepared: PrepareSummary | None = None,
                      ) -> TrainingRun | None:
    """The training run's tokens, passes, GPU hours and price. Data size: the run's prepare summary (fetched
    with the run), else the tokenized train split where this machine finds it, else data.rows."""
    if run is None:
        notes.append(f"training run: run config {cfg.pipeline.run_config} not found here")
        return None
    max_length = run.max_length
    rows: float | None = run.data.rows * run.data.split_ratio if run.data.rows is not None else None
    kept = prepared_tokens(prepared)
    if kept is not None:
        rows, tokens = kept
        notes.append(f"training tokens: {tokens:,} in {rows:,} train rows, from the run's prepare summary")
    else:
        tokens = tokenized_tokens(run.locate().train_dataset_dir)
    if tokens is None and rows is None:
        notes.append("training run: dataset size unknown (no tokenized dataset here and data.rows unset)")
        return None
    if tokens is None:
        per_row = cfg.pricing.training.avg_tokens_per_row or run.data.max_length
        tokens = rows * per_row
        basis = "tokens/row from pricing.training.avgTokensPerRow" if cfg.pricing.training.avg_tokens_per_row \
            else "data.max_length tokens/row (upper bound)"
        notes.append(f"training tokens: {rows:g} train rows x {per_row:g} ({basis})")
    gpus = training_devices(cfg, measured)
    epochs = passes(run.train, tokens, rows, gpus, max_length, notes)
    tps, source = choose_throughput(cfg, run, measured, notes)
    if tps is None:
        notes.append("training run: no throughput (set pricing.training.tokensPerSecondPerGpu or run training once)")
    hourly = None
    if cfg.target == "nebius":
        hourly = workers_hourly_usd(cfg, book)
    else:
        notes.append("training run: an existing cluster has no price here; hours only")
    return training_run(tokens, epochs, tps, source, gpus, hourly)


def cost_report(cfg: StackConfig, root: Path = REPO_ROOT, measured: ThroughputMeasurement | None = None,
                prepared: PrepareSummary | None = None) -> CostReport:
    """Monthly TCO, training-run cost and the fixed cost-per-chat scenarios of a stack; `measured`: the training
    throughput a run on this stack measured, `prepared`: its prepare summary (both fetched from the Slurm
    machine), when there are."""
    book = PriceBook(cfg.pricing.overrides)
    monthly = monthly_cost(cfg, cfg.pricing, book)
    notes = [line.note and f"{line.label}: {line.note}" for line in monthly.lines if line.note]
    run = load_run(cfg, root)
    training = training_estimate(cfg, run, book, notes, measured, prepared) if cfg.target != "local" else None
    chats = chat_scenarios(monthly, cfg.pricing.chat) if monthly.usd_high > 0 else []
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
    out = [f"Monthly cost (prices as of {m.pricing_date}; see infra/cost/pricing.py for sources):", fmt(rows[0])]
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
