"""Each stage's Slurm time limit from the run config's `time_limits` section; training's from the cost model's
estimate of the run's wall time (infra.sizing.duration) with the section's margin."""

from __future__ import annotations

import math

from documents.sections.time_limits import TimeLimitsConfig


def train_time_limit(limits: TimeLimitsConfig, wall_hours: float | None) -> tuple[int, str]:
    """Training's limit in minutes and where it comes from."""
    if limits.train_minutes is not None:
        return limits.train_minutes, "run config"
    if wall_hours is None or wall_hours <= 0:
        return limits.train_default_minutes, "default: no training estimate"
    minutes = math.ceil(wall_hours * 60 * limits.train_margin) + limits.train_overhead_minutes
    return minutes, (f"estimate {wall_hours * 60:.0f} min x {limits.train_margin:g} "
                     f"+ {limits.train_overhead_minutes} min")


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
    """Minutes as Slurm prints a TimeLimit ([D-]HH:MM:SS)."""
    days, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text
