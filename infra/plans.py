"""A stack's run plan: the stack config as the planner reads it (`StackConfig.plan_stack`, with the housekeeping
partition of a nebius stack's environment build) handed to `planning.planner.plan_run`. Every consumer in infra/ (the
price, the chain, `ftstack plan`, the policy pack) takes its plan from here, so they read one plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from documents.prepare_summary import PrepareSummary
from documents.run_config import RunConfig
from documents.run_plan import RunPlan
from documents.throughput import ThroughputMeasurement
from infra.config import StackConfig
from infra.soperator.values import HOUSEKEEPING, HOUSEKEEPING_SLURMD
from planning.planner import plan_run
from planning.stack import PlanStack


def plan_stack(cfg: StackConfig) -> PlanStack:
    """The stack as the planner reads it; on a nebius stack the environment build's housekeeping partition."""
    stack = cfg.plan_stack()
    if cfg.target != "nebius":
        return stack
    return stack.model_copy(update={"housekeeping_partition": HOUSEKEEPING,
                                    "housekeeping_cpus": HOUSEKEEPING_SLURMD.cpu_m // 1000})


def stack_plan(cfg: StackConfig, run: RunConfig, measured: ThroughputMeasurement | None = None, *,
               prepared: PrepareSummary | None = None, read_from: str | None = None,
               stored_ranks: Sequence[int] = (), stage_seconds: Mapping[str, float] | None = None,
               stage_seconds_from: str | None = None) -> RunPlan:
    """The run's plan on the stack (planning.planner.plan_run)."""
    return plan_run(plan_stack(cfg), run, measured, prepared=prepared, read_from=read_from, stored_ranks=stored_ranks,
                    stage_seconds=stage_seconds, stage_seconds_from=stage_seconds_from)
