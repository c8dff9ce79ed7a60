"""The month at the utilization the runs measured: elastic worker sets (ephemeral nodes on a node group that scales
to fewer nodes, infra/config.py `WorkerSet.elastic`) priced for the node-hours the stack's schedule keeps them up,
beside the always-on month (`MonthlyCost.usd_high`).

- A run holds nodes for each stage's elapsed time: the stage costs of the run's plan (documents/run_plan.py, the plan
  the chain submits: readiness every node of the first worker set, train the nodes it trains on, prepare and eval
  one), at the job times the newest stored run measured, else the training estimate alone. After its last job a
  node stays up `soperator.suspendTimeSeconds` before Slurm powers it down (one tail per node and run). Boot time is
  not measured and not priced.
- Preemptible workers: run hours x (1 + `pricing.schedule.requeueOverhead`), the expected work redone after
  preemptions (requeue, restart from the last checkpoint), at the preemptible rate `node_price` already uses.
- Serving: `servingNodes` nodes of the first worker set for `servingHoursPerMonth`; with workers reserved for
  serving (`serving.nodes`) those nodes instead, always on (their NodeSet is not ephemeral) and priced in their own
  monthly lines, apart from the training nodes.
- Every other line (system, controller, login, storage, non-elastic workers) stays as in the always-on month;
  active checks stay the one-off line they are there.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from documents.run_plan import RunPlan
from documents.stack_outputs import UtilizationCost
from infra.config import StackConfig, WorkerSet
from infra.cost.tco import MonthlyCost
from planning.prices import HOURS_PER_MONTH, ScheduleAssumptions


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StageHours(_Frozen):
    stage: str
    hours: float
    nodes: int

    @property
    def node_hours(self) -> float:
        return self.hours * self.nodes


def stage_hours(plan: RunPlan) -> tuple[list[StageHours], str]:
    """The hours each run stage holds its planned nodes for (the plan's `StageCost`s) and their basis: every stage's
    measured job time where the newest stored run timed them, else the training estimate alone."""
    if any(c.measured_hours is not None for c in plan.costs):
        where = f" of {plan.stage_times_from}" if plan.stage_times_from else ""
        return ([StageHours(stage=c.stage, hours=c.measured_hours, nodes=c.nodes) for c in plan.costs
                 if c.measured_hours is not None], f"measured job times{where}")
    train = plan.cost("train")
    if train is not None and train.hours is not None and plan.size is not None:
        return ([StageHours(stage="train", hours=train.hours, nodes=train.nodes)],
                f"training estimate only ({plan.size.throughput_kind}); prepare, readiness and eval not measured")
    return [], "no run measured and no training estimate: serving hours only"


def _always_on(monthly: MonthlyCost, worker: WorkerSet, role: str = "worker") -> float:
    """The worker set's compute and boot-disk lines in the always-on month (keys as infra/cost/tco.py names them);
    role `serving`: the lines of its nodes reserved for serving."""
    slug = re.sub(r"[^a-z0-9]+", "_", f"{role}_{worker.name}".lower()).strip("_")
    keys = {f"compute_{slug}", f"boot_disk_{slug}"}
    return sum(line.usd_high for line in monthly.lines if line.key in keys)


def utilization(cfg: StackConfig, monthly: MonthlyCost, node_usd_per_hour: float, schedule: ScheduleAssumptions,
                plan: RunPlan | None) -> UtilizationCost | None:
    """The month at `schedule` with the elastic worker sets priced by the hour (`node_usd_per_hour`: one node of the
    first worker set, compute and boot disk) for the stage hours of the run's plan, unrounded; None without an
    elastic set."""
    elastic = [w for w in cfg.nodes.workers if w.elastic] if cfg.nodes else []
    if cfg.target != "nebius" or not elastic or cfg.soperator is None or cfg.nodes is None:
        return None
    first = cfg.nodes.workers[0]
    stages, basis = stage_hours(plan) if plan is not None else ([], "no run config: serving hours only")
    nodes_used = max((s.nodes for s in stages), default=0)
    overhead = schedule.requeue_overhead if first.preemptible else 0.0
    tail = nodes_used * cfg.soperator.suspend_time_seconds / 3600
    run_node_hours = sum(s.node_hours for s in stages) * (1 + overhead) + tail
    reserved = cfg.serving.nodes
    if reserved:
        serving = reserved * HOURS_PER_MONTH
        serving_usd = _always_on(monthly, first, "serving")
        hours = run_node_hours * schedule.runs_per_month
        serving_text = f"{reserved} reserved serving node(s) always on (serving.nodes), priced in their own lines"
    else:
        serving = schedule.serving_nodes * schedule.serving_hours_per_month
        serving_usd = serving * node_usd_per_hour
        hours = run_node_hours * schedule.runs_per_month + serving
        serving_text = f"{schedule.serving_nodes} serving node(s) x {schedule.serving_hours_per_month:g} h"
    usd = monthly.usd_high - sum(_always_on(monthly, w) for w in elastic)
    usd += (hours * node_usd_per_hour) if first.elastic else 0.0
    if not first.elastic:
        basis += "; the first worker set (where runs and serving go) is always on"
    stage_text = f" ({', '.join(f'{s.stage} {s.hours:.2f} h x {s.nodes}' for s in stages)})" if stages else ""
    basis = (f"{basis}{stage_text}; {schedule.runs_per_month:g} runs/month, {serving_text}; suspend tail "
             f"{cfg.soperator.suspend_time_seconds} s per node and run; requeue overhead {overhead:.0%}"
             f"{' (preemptible)' if first.preemptible else ''}")
    return UtilizationCost(always_on_usd=monthly.usd_high, usd=usd, runs_per_month=schedule.runs_per_month,
                           run_node_hours=run_node_hours, serving_node_hours=serving, serving_usd=serving_usd,
                           worker_node_hours=hours,
                           requeue_overhead=overhead, basis=basis)
