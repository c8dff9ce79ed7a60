"""The stack's ceilings on one training run (`pipeline.maxRunUsd`, `pipeline.maxRunHours`): a run config whose
estimated cost or wall time is over either is refused before anything is planned or submitted."""

from __future__ import annotations

from infra.config import PipelineConfig


class RunCeilingError(ValueError):
    """A training run over a ceiling of its stack; the message names the ceiling, its value and the estimate."""


def check_run_ceilings(pipeline: PipelineConfig, run_name: str, wall_hours: float | None, usd: float | None) -> None:
    """Refuse a training run estimated over `pipeline.maxRunHours` or `pipeline.maxRunUsd` (an unknown figure, no
    throughput or no price, is not refused)."""
    over = []
    if wall_hours is not None and not wall_hours <= pipeline.max_run_hours:
        over.append(f"an estimated {wall_hours:,.1f} h of wall time, over pipeline.maxRunHours "
                    f"{pipeline.max_run_hours:g} h")
    if usd is not None and not usd <= pipeline.max_run_usd:
        over.append(f"an estimated ${usd:,.2f}, over pipeline.maxRunUsd ${pipeline.max_run_usd:,.2f}")
    if over:
        raise RunCeilingError(f"run config {pipeline.run_config} (run {run_name!r}): training would take "
                              f"{' and '.join(over)}; shorten the run (train.max_steps, train.epochs, data.rows) "
                              "or raise the ceiling in the stack file")
