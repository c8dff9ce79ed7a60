"""The month at measured utilization beside always-on (infra/cost/utilization.py through infra/cost/price.py):
seed 000's figures for the L40S workers, the stack's schedule, preemptible rates with the requeue overhead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from documents.run_record import RunIndex, write_run_record
from documents.stack_outputs import Cost
from infra.config import StackConfig, load_run, load_stack_config
from infra.cost.price import PriceInputs, price_stack
from planning.prices import ScheduleAssumptions
from infra.runs.measured import price_inputs
from infra.runs.store import INDEX_NAME, local_store, run_prefix

# seed 000's TCO table: 5 L40S workers $16,680 a month, their boot disks $148 (730 h)
SEED_WORKERS_USD, SEED_WORKER_DISKS_USD, SEED_NODES = 16680, 148, 5
STAGES = {"prepare": 600.0, "readiness": 300.0, "train": 3600.0, "eval": 900.0}


def _with_workers(cfg: StackConfig, **update) -> StackConfig:
    assert cfg.nodes
    workers = [w.model_copy(update=update) for w in cfg.nodes.workers]
    return cfg.model_copy(update={"nodes": cfg.nodes.model_copy(update={"workers": workers})})


def test_demo_at_a_weekly_retrain_and_one_serving_worker() -> None:
    """Prepare and eval hold one node, readiness and train all five; each node stays up 600 s after the run."""
    cfg = load_stack_config("demo")
    report = price_stack(cfg, PriceInputs(stage_seconds=STAGES, stage_seconds_from="run r1"), load_run(cfg))
    used = report.utilization
    assert used is not None
    stage_node_hours = (600 + 900) / 3600 + (300 + 3600) / 3600 * 5
    run = stage_node_hours + 5 * 600 / 3600
    assert used.run_node_hours == pytest.approx(run)
    assert used.runs_per_month == pytest.approx(52 / 12)
    assert used.worker_node_hours == pytest.approx(run * 52 / 12 + 730)
    per_node_hour = (SEED_WORKERS_USD + SEED_WORKER_DISKS_USD) / SEED_NODES / 730
    always_on = report.monthly.usd_high
    expected = always_on - SEED_WORKERS_USD - SEED_WORKER_DISKS_USD + used.worker_node_hours * per_node_hour
    assert used.usd == pytest.approx(expected, rel=0.01)
    assert used.always_on_usd == always_on
    assert "measured job times of run r1" in used.basis and "train 1.00 h x 5" in used.basis


def test_the_always_on_total_of_the_elastic_demo_stays_seed_000s() -> None:
    """Ephemeral workers change what a month at a schedule costs, not the always-on month: seed 000's high total
    ($19,054) within 1 %, with the monitoring and active checks the seed lacks taken out."""
    cfg = load_stack_config("demo")
    assert cfg.soperator
    off = cfg.soperator.active_checks.model_copy(update={"scope": "off"})
    seedlike = cfg.model_copy(update={"monitoring": cfg.monitoring.model_copy(update={"enabled": False}),
                                      "soperator": cfg.soperator.model_copy(update={"active_checks": off})})
    report = price_stack(seedlike, run=load_run(seedlike))
    assert report.monthly.usd_high == pytest.approx(19054, rel=0.01)
    assert report.utilization is not None and report.utilization.always_on_usd == report.monthly.usd_high


def test_preemptible_workers_pay_the_requeue_overhead_at_the_preemptible_rate() -> None:
    """h100's workers preemptible: $1.25 per H100 GPU-hour (planning/prices.py's H100 source), 8 per node; the
    stage node-hours grow by the stated requeue overhead, the suspend tail does not."""
    cfg = _with_workers(load_stack_config("h100"), preemptible=True)
    stages = {"readiness": 360.0, "train": 3600.0}
    report = price_stack(cfg, PriceInputs(stage_seconds=stages), load_run(cfg))
    used = report.utilization
    assert used is not None and used.requeue_overhead == 0.15
    run = (0.1 + 1.0) * 2 * 1.15 + 2 * 600 / 3600
    assert used.run_node_hours == pytest.approx(run)
    disks = next(line for line in report.monthly.lines if line.key == "boot_disk_worker_worker")
    per_node_hour = 8 * 1.25 + disks.usd_high / 2 / 730
    workers = next(line for line in report.monthly.lines if line.key == "compute_worker_worker")
    expected = report.monthly.usd_high - workers.usd_high - disks.usd_high + used.worker_node_hours * per_node_hour
    assert used.usd == pytest.approx(expected)
    assert "requeue overhead 15% (preemptible)" in used.basis


def test_the_schedule_is_the_stacks_and_fixed_workers_have_no_utilization_scenario() -> None:
    cfg = load_stack_config("demo")
    none_served = cfg.model_copy(update={"pricing": cfg.pricing.model_copy(update={
        "schedule": ScheduleAssumptions(runs_per_month=1, serving_nodes=0)})})
    used = price_stack(none_served, PriceInputs(stage_seconds={"train": 3600.0}), load_run(cfg)).utilization
    assert used is not None and used.worker_node_hours == pytest.approx(5 + 5 * 600 / 3600)
    fixed = _with_workers(cfg, ephemeral=False, initial_active=None, min_size=None)
    assert price_stack(fixed, run=load_run(fixed)).utilization is None
    dev = load_stack_config("dev")
    assert price_stack(dev, run=load_run(dev)).utilization is None


def test_without_a_stored_run_the_training_estimate_is_the_basis() -> None:
    demo = load_stack_config("demo")
    report = price_stack(demo, run=load_run(demo))
    used, training = report.utilization, report.training
    assert used is not None and training is not None and training.wall_hours is not None
    assert used.run_node_hours == pytest.approx(training.wall_hours * 5 + 5 * 600 / 3600)
    assert used.basis.startswith("training estimate only")


def test_stage_times_are_read_from_the_newest_stored_run_that_has_them(tmp_path: Path) -> None:
    store = local_store(tmp_path)
    for run_id, durations in (("20261101T000000Z-1", {"train": 100.0}), ("20261102T000000Z-2", STAGES),
                              ("20261103T000000Z-3", {})):
        index = RunIndex(stack="cluster", run_id=run_id, uploaded_at=run_id, started_at=run_id,
                         job_durations_s=durations)
        store.put_bytes(f"{run_prefix('cluster', run_id)}/{INDEX_NAME}", write_run_record(index).encode())
    inputs = price_inputs(load_stack_config("cluster"), tmp_path)
    assert inputs.stage_seconds == STAGES
    assert inputs.stage_seconds_from is not None and "20261102T000000Z-2" in inputs.stage_seconds_from


def test_the_cost_outputs_carry_both_totals_and_the_basis() -> None:
    demo = load_stack_config("demo")
    section = price_stack(demo, PriceInputs(stage_seconds=STAGES), load_run(demo)).section()
    flat = section.flat()
    assert flat["cost_utilization_always_on_usd"] == flat["cost_monthly_usd_high"]
    assert flat["cost_utilization_usd"] < flat["cost_monthly_usd_high"]
    assert flat["cost_utilization_basis"].startswith("measured job times")
    back = Cost.model_validate(Cost.unflatten(json.loads(json.dumps(flat))))
    assert back.utilization == section.utilization
