"""The size of a stack's training run: the tokens it trains on and the passes it makes over them. The caller passes
the run config it loaded; nothing here reads one."""

from __future__ import annotations

from pathlib import Path

from documents.prepare_summary import PrepareSummary
from documents.run_config import RunConfig
from documents.sections.train import TrainConfig
from documents.train_plan import planned_batching
from planning.stack import PlanStack
from planning.batches import tokens_per_step


def tokenized_tokens(tokenized_dir: Path) -> int | None:
    """Sum of the ``length`` column of a ``datasets.save_to_disk`` folder, read with pyarrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    files = sorted(tokenized_dir.glob("*.arrow")) if tokenized_dir.is_dir() else []
    if not files:
        return None
    total = 0
    for file in files:
        with pa.memory_map(str(file)) as source:
            table = pa.ipc.open_stream(source).read_all()
        if "length" not in table.column_names:
            return None
        total += int(pc.sum(table["length"]).as_py() or 0)
    return total


def passes(train: TrainConfig | None, tokens: float, rows: float | None, gpus: int, max_length: int,
           notes: list[str]) -> float:
    """Passes over the data the run makes: `epochs`, or as far as `max_steps` reaches when it is set (the
    trainer stops at max_steps, inside the first epoch or after several)."""
    if train is None:
        return 1.0
    if train.max_steps is None:
        return float(train.epochs)
    per_step = tokens_per_step(train, max_length, planned_batching(train.batching), gpus,
                               tokens / rows if rows else None)
    epochs = train.max_steps * per_step / tokens
    notes.append(f"training run: max_steps {train.max_steps} x {per_step:,.0f} tokens/step = {epochs:.3g} "
                 f"passes over {tokens:,.0f} tokens")
    return epochs


def prepared_tokens(prepared: PrepareSummary | None) -> tuple[int, int] | None:
    """Train rows and tokens the run's prepare stage kept (its prepare.json), when it recorded the mean length."""
    side = prepared.tokenized.get("train") if prepared is not None else None
    if side is None or side.mean_tokens is None:
        return None
    return side.rows_kept, round(side.rows_kept * side.mean_tokens)


def training_tokens(cfg: PlanStack, run: RunConfig, prepared: PrepareSummary | None,
                    notes: list[str]) -> tuple[float, float | None] | None:
    """(tokens, train rows) of one pass over the data: the run's prepare summary (fetched with the run), else the
    tokenized train split where this machine finds it, else data.rows x tokens per row; None when unknown."""
    rows: float | None = run.data.rows * run.data.split_ratio if run.data.rows is not None else None
    kept = prepared_tokens(prepared)
    if kept is not None:
        rows, tokens = kept
        notes.append(f"training tokens: {tokens:,} in {rows:,} train rows, from the run's prepare summary")
        return tokens, rows
    tokenized = run.locate().train_dataset_dir
    found = tokenized_tokens(tokenized)
    if found is not None:
        notes.append(f"training tokens: {found:,} in the tokenized train split at {tokenized}")
        return found, rows
    if rows is None:
        notes.append("training run: dataset size unknown (no tokenized dataset here and data.rows unset)")
        return None
    per_row = cfg.pricing.training.avg_tokens_per_row or run.data.max_length
    basis = "tokens/row from pricing.training.avgTokensPerRow" if cfg.pricing.training.avg_tokens_per_row \
        else "data.max_length tokens/row (upper bound)"
    notes.append(f"training tokens: {rows:g} train rows x {per_row:g} ({basis})")
    return rows * per_row, rows
