"""Each stage's Slurm time limit from the run config's `time_limits` section; training's from the cost model's
estimate of the run's wall time (planning.planner: the training hours it prices) with the section's margin."""

from __future__ import annotations

import math

from documents.sections.time_limits import MAX_MINUTES, TimeLimitsConfig


class TimeLimitError(ValueError):
    """A time limit outside what a Slurm job here may ask for; the message names the figure and the bound."""


def train_time_limit(limits: TimeLimitsConfig, wall_hours: float | None) -> tuple[int, str]:
    """Training's limit in minutes and where it comes from; a TimeLimitError when the estimate asks for more than
    MAX_MINUTES (the plan's run ceilings refuse such a run first, naming its cost and wall time)."""
    if limits.train_minutes is not None:
        return limits.train_minutes, "run config"
    if wall_hours is None or wall_hours <= 0:
        return limits.train_default_minutes, "default: no training estimate"
    basis = f"estimate {wall_hours * 60:.0f} min x {limits.train_margin:g} + {limits.train_overhead_minutes} min"
    minutes = wall_hours * 60 * limits.train_margin + limits.train_overhead_minutes
    if not minutes <= MAX_MINUTES:  # NaN and infinity too
        raise TimeLimitError(f"training's time limit ({basis}) exceeds {slurm_duration(MAX_MINUTES)}, the longest a "
                             "stage may ask for: shorten the run (train.max_steps, epochs, data.rows)")
    return math.ceil(wall_hours * 60 * limits.train_margin) + limits.train_overhead_minutes, basis


def stage_time_limits(limits: TimeLimitsConfig, train_wall_hours: float | None) -> dict[str, int | None]:
    """Minutes by stage (None: no limit, the serving job)."""
    return {
        "environment": limits.environment_minutes,
        "prepare": limits.prepare_minutes,
        "readiness": limits.readiness_minutes,
        "train": train_time_limit(limits, train_wall_hours)[0],
        "eval": limits.eval_minutes,
        "serve": limits.serve_minutes,
        "publish": limits.publish_minutes,
    }


def slurm_duration(minutes: int) -> str:
    """Minutes as Slurm prints a TimeLimit ([D-]HH:MM:SS), for 1 to MAX_MINUTES minutes."""
    if not 1 <= minutes <= MAX_MINUTES:
        raise TimeLimitError(f"time limit {minutes} min: a stage's limit is 1 to {MAX_MINUTES} minutes (366 days)")
    days, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text
