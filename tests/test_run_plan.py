"""One plan, decided once (issue 60): the RunPlan document, and a test per disagreement the issue found between what
`ftstack plan` shows and what is priced, submitted, trained and served."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from documents.run_config import load_run_config, parse_run_config
from documents.run_plan import PLAN_ENV, read_run_plan, write_run_plan
from infra.config import load_run, load_stack_config
from infra.cost.price import PriceInputs, measured_plan, price_stack
from infra.pipeline.chain import code_location_for, job_plan, pipeline_jobs
from infra.plans import stack_plan
from planning.job_check import JobHardware, PlanMismatch, checked_placement
from planning.model_shapes import shape_for_source
from planning.planner import PlanRefused, check_plan

ROOT = Path(__file__).resolve().parents[1]
STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
LLAMA70 = "hub:meta-llama/Llama-3.1-70B-Instruct"


def _run_document(stack: str) -> dict:
    cfg = load_stack_config(stack, ROOT / "stacks")
    return json.loads((ROOT / cfg.pipeline.run_config).read_text())


def _with_rank(document: dict, rank: int, limit: int | None) -> dict:
    train = {**document["train"], "lora": {**document["train"]["lora"], "r": rank}}
    serve = {**document.get("serve", {}), **({"max_lora_rank": limit} if limit else {})}
    return {**document, "train": train, "serve": serve}


def test_the_plan_reads_back_as_written(tmp_path: Path) -> None:
    cfg = load_stack_config("demo", ROOT / "stacks")
    plan = price_stack(cfg, PriceInputs(), load_run(cfg, ROOT)).plan
    assert plan is not None
    path = write_run_plan(plan, tmp_path / "run_plan.json")
    assert read_run_plan(path.read_bytes(), str(path)) == plan
    with pytest.raises(ValueError, match="run_plan.json: not a valid run plan .*stages"):
        read_run_plan(b'{"stack": "demo"}', "run_plan.json")


def test_a_rank_32_run_the_configured_limit_cannot_take_is_refused_at_plan_time(tmp_path: Path) -> None:
    """h100.json with train.lora.r 32 under serve.max_lora_rank 16: refused by `ftstack plan` naming both ranks,
    before anything is submitted (it used to plan, train, then be refused by the serve job)."""
    config = tmp_path / "rank32.json"
    config.write_text(json.dumps(_with_rank(_run_document("h100"), 32, 16)))
    proc = subprocess.run([sys.executable, "-m", "infra.commands.cli", "plan", "--stack", "h100", "--run-config",
                           str(config)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "LoRA rank 32 is over serve.max_lora_rank 16" in proc.stderr, proc.stderr


def test_the_serving_limit_comes_from_the_adapters_served_unless_set() -> None:
    cfg = load_stack_config("h100", ROOT / "stacks")
    document = _run_document("h100")
    unset = stack_plan(cfg, parse_run_config(_with_rank(document, 32, None), "rank32.json"))
    assert unset.serving is not None and unset.serving.fits and unset.serving.max_lora_rank == 32
    stored = stack_plan(cfg, parse_run_config(_with_rank(document, 32, None), "r.json"), stored_ranks=[16, 64])
    assert stored.serving.max_lora_rank == 64, "the largest stored adapter the server loads counts too"
    refused = stack_plan(cfg, parse_run_config(_with_rank(document, 32, 16), "r.json"))
    with pytest.raises(PlanRefused, match="rank 32 is over serve.max_lora_rank 16"):
        check_plan(refused)


def test_the_utilization_month_prices_the_nodes_the_run_trains_on() -> None:
    """demo's 70B LoRA trains on one of the first worker set's five nodes (test_train_placement): the elastic month
    holds one node for the training hours (and its suspend tail), not five."""
    cfg = load_stack_config("demo", ROOT / "stacks")
    document = _run_document("demo")
    run = parse_run_config({**document, "model": {**document["model"], "source": LLAMA70},
                            "train": {**document["train"], "method": "lora", "quantization": "none"}}, "demo.json")
    report = price_stack(cfg, PriceInputs(), run)
    assert report.plan.stages["train"].nodes == 1 and cfg.nodes.workers[0].size == 5
    hours = report.training.wall_hours
    tail = cfg.soperator.suspend_time_seconds / 3600
    assert report.utilization.run_node_hours == pytest.approx(hours * 1 + 1 * tail)


@pytest.mark.parametrize("stack", STACKS)
def test_the_chain_submits_the_plans_request_for_every_stage(stack: str) -> None:
    cfg = load_stack_config(stack, ROOT / "stacks")
    run = load_run_config(ROOT / cfg.pipeline.run_config)
    plan = price_stack(cfg, PriceInputs(), run).plan
    assert measured_plan(cfg, PriceInputs(), run) == plan, "the runner and the program submit the plan priced"
    jobs = pipeline_jobs(cfg, run, cfg.pipeline.run_config, "c", code_location_for(cfg, run, ROOT), serve=True,
                         plan=plan)
    assert jobs and {j.stage for j in jobs} <= set(plan.stages)
    for job in jobs:
        request = plan.stages[job.stage]
        assert job.extra_args == request.sbatch_args(), job.stage
        assert job.time_limit_minutes == request.time_limit_minutes, job.stage
    train = next(j for j in jobs if j.stage == "train")
    assert read_run_plan(train.env[PLAN_ENV], PLAN_ENV) == job_plan(plan), "the train job gets the plan it trains with"
    if plan.training is not None:
        assert f"--nodes={plan.training.nodes}" in train.extra_args


def _h100_plan(**train: object):
    cfg = load_stack_config("h100", ROOT / "stacks")
    document = _run_document("h100")
    run = parse_run_config({**document, "train": {**document["train"], **train}}, "h100.json")
    plan = stack_plan(cfg, run)
    assert plan.training is not None
    return run, plan.training


def _got(planned, **changes: object) -> JobHardware:
    return JobHardware(**{"world_size": planned.world_size, "ranks_per_node": planned.gpus_per_node,
                          "gpu_memory_gib": planned.gpu_memory_gib, "host_memory_gib": planned.host_memory_gib,
                          **changes})


def test_the_job_trains_as_planned_where_the_plan_fits_what_it_got() -> None:
    run, planned = _h100_plan()
    placed, differences = checked_placement(run, shape_for_source(run.model.source), planned, _got(planned))
    assert differences == []
    assert (placed.plan, placed.batches) == (planned.parallelism, planned.batches)


def test_the_job_refuses_a_world_size_other_than_the_plans() -> None:
    run, planned = _h100_plan()
    assert (planned.nodes, planned.gpus_per_node) == (2, 8)  # h100: 2 nodes x 8 H100 (stacks/Pulumi.h100.yaml)
    with pytest.raises(PlanMismatch, match=r"the plan trains on 16 ranks \(2 node\(s\) x 8\); this job has 8 ranks"):
        checked_placement(run, shape_for_source(run.model.source), planned, _got(planned, world_size=8))


def test_less_gpu_memory_fails_naming_both_figures_where_the_plan_cannot_adapt() -> None:
    run, planned = _h100_plan()
    with pytest.raises(PlanMismatch, match=r"GPU memory 40.00 GiB measured, 79.19 GiB planned: the plan's ddp"):
        checked_placement(run, shape_for_source(run.model.source), planned, _got(planned, gpu_memory_gib=40.0))


def test_less_gpu_memory_adapts_an_auto_micro_batch_and_says_so() -> None:
    run, planned = _h100_plan(micro_batch_tokens="auto", gradient_checkpointing="auto")
    assert planned.adaptable == ["micro_batch_tokens", "gradient_checkpointing"]
    placed, differences = checked_placement(run, shape_for_source(run.model.source), planned,
                                            _got(planned, gpu_memory_gib=60.0))
    assert placed.plan.strategy == planned.parallelism.strategy and placed.fits
    assert differences, "60 GiB instead of 79.19 GiB changes the auto-sized micro-batch or recomputation"
    assert all(d.startswith("GPU memory 60.00 GiB measured, 79.19 GiB planned") for d in differences), differences


SEED_NODE_HOUR_USD = 16680 / 5 / 730
"""seed 000's TCO table: 5 L40S workers $16,680 a month of 730 h, one node's hour of compute."""
TIMED = {"prepare": 600.0, "readiness": 300.0, "train": 3600.0, "eval": 900.0}


def test_every_run_stage_has_its_hours_nodes_and_price_with_the_basis() -> None:
    """demo: prepare and eval hold one node, readiness all five, train its planned nodes; every stage but training
    at the job time the newest stored run measured, priced at seed 000's node hour; training at its estimate."""
    cfg = load_stack_config("demo", ROOT / "stacks")
    timed = price_stack(cfg, PriceInputs(stage_seconds=TIMED, stage_seconds_from="run r1"), load_run(cfg, ROOT))
    plan = timed.plan
    assert [c.stage for c in plan.costs] == ["prepare", "readiness", "train", "eval"]
    assert plan.stage_times_from == "run r1"
    for cost in plan.costs:
        assert cost.nodes == (plan.stages[cost.stage].nodes or 1), cost.stage
        assert cost.measured_hours == pytest.approx(TIMED[cost.stage] / 3600), cost.stage
        assert cost.usd_per_hour == pytest.approx(cost.nodes * SEED_NODE_HOUR_USD, rel=0.01), cost.stage
        if cost.stage != "train":
            assert cost.hours == cost.measured_hours and "measured job time of run r1" in cost.basis
            assert cost.usd == pytest.approx(TIMED[cost.stage] / 3600 * cost.nodes * SEED_NODE_HOUR_USD, rel=0.01)
    assert [plan.cost(s).nodes for s in ("prepare", "readiness", "eval")] == [1, 5, 1]
    train = plan.cost("train")
    assert train.hours == timed.training.wall_hours and train.usd == timed.training.usd, "training at its estimate"
    untimed = price_stack(cfg, PriceInputs(), load_run(cfg, ROOT)).plan
    assert [c.hours for c in untimed.costs if c.stage != "train"] == [None, None, None]
    assert all("not measured" in c.basis for c in untimed.costs if c.stage != "train")
    assert untimed.stage_times_from is None and untimed.cost("train").hours == train.hours


def test_the_training_nodes_are_chosen_at_the_throughput_the_run_is_priced_with() -> None:
    """demo's 70B LoRA trains on 1 node at its estimated throughput (test_the_utilization_month_prices_the_nodes...);
    a run that measured 10 tokens/s per GPU trains fastest on all five (planning.time_model.fastest_nodes at that
    figure): the plan asks for those, prices those, and `ftstack plan`'s placement lines show those."""
    from documents.throughput import ThroughputMeasurement
    from planning import catalog
    from planning.fit import planned_throughput, worker_fits
    from planning.placement import Hardware
    from planning.time_model import fastest_nodes

    cfg = load_stack_config("demo", ROOT / "stacks")
    document = _run_document("demo")
    run = parse_run_config({**document, "model": {**document["model"], "source": LLAMA70},
                            "train": {**document["train"], "method": "lora", "quantization": "none"}}, "demo.json")
    measured = ThroughputMeasurement(tokens_per_second_per_device=10.0, device="NVIDIA L40S", devices=8,
                                     gpu_model="NVIDIA L40S", model=LLAMA70, method="lora", date="2026-12-01",
                                     origin="run", stack="demo", run_id="r1", source="run r1")
    worker = cfg.nodes.workers[0]
    platform = catalog.get_platform(worker.platform)
    hardware = Hardware(gpu_memory_gib=platform.usable_gpu_memory_gib, gpus_per_node=worker.shape.gpus,
                        host_memory_gib=worker.shape.ram_gib)
    shape = shape_for_source(LLAMA70)
    fastest = fastest_nodes(run, shape, hardware, worker.size, worker.platform, platform.gpu_model, 10.0)
    assert fastest is not None and fastest.nodes == 5, "the figure this test is built on"
    report = price_stack(cfg, PriceInputs(training=measured), run)
    plan = report.plan
    assert plan.tokens_per_second_per_gpu == 10.0 and plan.size.throughput_kind == "measured"
    assert plan.stages["train"].nodes == plan.training.nodes == plan.cost("train").nodes == 5
    assert report.training.gpus == 5 * hardware.gpus_per_node
    [first, *_] = worker_fits(cfg.plan_stack(), run, shape, planned_throughput(plan))
    assert first.placement.nodes == 5, "the placement `ftstack plan` and the policy show is the plan's"


def test_the_stored_adapters_ranks_reach_the_plan(tmp_path: Path) -> None:
    """A stored run of the `cluster` stack trained a rank-64 adapter: the plan's serving limit takes it (64 where
    unset), and a serve.max_lora_rank 32 that cannot is refused at plan time naming the stored rank."""
    from adapter_runs import register_run

    from infra.runs.measured import price_inputs
    from infra.runs.store import local_store

    base, adapter = tmp_path / "base", tmp_path / "adapter"
    for folder, name in ((base, "config.json"), (adapter, "adapter_config.json")):
        folder.mkdir()
        (folder / name).write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"0")
    register_run(local_store(tmp_path), tmp_path / "runs", "20261201T000000Z-1", base, adapter, 64, stack="cluster")
    cfg = load_stack_config("cluster", ROOT / "stacks")
    inputs = price_inputs(cfg, tmp_path)
    assert inputs.stored_ranks == [64]
    document = _run_document("cluster")
    unset = measured_plan(cfg, inputs, parse_run_config(_with_rank(document, 16, None), "r.json"))
    assert unset.serving.max_lora_rank == 64 and unset.serving.fits
    refused = measured_plan(cfg, inputs, parse_run_config(_with_rank(document, 16, 32), "r.json"))
    with pytest.raises(PlanRefused, match="rank 64 is over serve.max_lora_rank 32"):
        check_plan(refused)
