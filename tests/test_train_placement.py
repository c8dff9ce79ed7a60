"""One decision, one order: `ftstack plan`, the preview's model-fits policy and the trainer place the shipped 70B
run configs identically (strategy, nodes, ranks, shards, micro-batch, accumulation, checkpointing) on the h100
stack's 2 x 8 H100s at the memory PyTorch reports for an H100 (79.19 GiB, measured; docs/training.md). The node's
RAM each counts host memory against is its own: the preset's (1,600 GiB) before the run, the machine's in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from documents.run_config import RunConfig
from infra.config import StackConfig, load_stack_config
from infra.config import load_run
from infra.plans import stack_plan
from planning.fit import planned_throughput, worker_fits
from policies import rules
from policies.rules import Context
from planning.model_shapes import shape_for_source

ROOT = Path(__file__).resolve().parent.parent
H100_REPORTED_GIB = 79.19
# meta-llama/Llama-3.1-70B config.json, as published
LLAMA70_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
                  "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                  "intermediate_size": 28672, "vocab_size": 128256, "tie_word_embeddings": False}


def plan_tps(cfg: StackConfig, run: RunConfig) -> float | None:
    """The throughput the run's plan chooses its training nodes at (the preview's `worker_fits` gets the same)."""
    return planned_throughput(stack_plan(cfg, run))


def _stack(config: str):
    cfg = load_stack_config("h100", ROOT / "stacks")
    return cfg.model_copy(update={"pipeline": cfg.pipeline.model_copy(update={"run_config": config})})


@pytest.mark.parametrize(("config", "strategy"), [("workloads/configs/h100-llama-3.1-70b-lora.json", "fsdp"),
                                                  ("workloads/configs/h100-llama-3.1-70b-qlora.json", "ddp")])
def test_plan_policy_and_trainer_place_the_shipped_70b_runs_alike(config, strategy, tmp_path, monkeypatch):
    from workloads.train import finetune
    from workloads.train import run_plan as job_plan
    from documents.run_plan import PLAN_ENV

    cfg = _stack(config)
    run = load_run(cfg, ROOT)
    [fit] = worker_fits(cfg.plan_stack(), run, shape_for_source(run.model.source), plan_tps(cfg, run))
    policy = fit.placement.model_dump(mode="json")
    assert rules.model_fits(Context([], cfg, run, {})) == []

    proc = subprocess.run([sys.executable, "-m", "infra.commands.cli", "plan", "--stack", "h100", "--run-config",
                           config, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [planned] = json.loads(proc.stdout)["placement"]

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA70_CONFIG))
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setattr(job_plan, "gpu_memory_gib", lambda: H100_REPORTED_GIB)  # no GPU here: what torch reports
    monkeypatch.delenv(PLAN_ENV, raising=False)  # submitted by hand: the job plans on what it got
    placed, differences = finetune.job_placement(run, model)
    trainer = placed.model_dump(mode="json")
    assert differences == []

    ram = {placement.pop("host_memory_gib") for placement in (planned["placement"], policy, trainer)}
    assert ram == {1600, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30}  # preset's, this machine's
    assert planned["placement"] == policy == trainer
    assert (trainer["nodes"], trainer["gpus_per_node"], trainer["plan"]["strategy"]) == (2, 8, strategy)
    assert trainer["plan"]["fits"] and trainer["batches"] is not None


# --- How many nodes a run trains on (issue 39): the fewest where it fits, more only where the estimate says faster.

LLAMA70_PARAMS = 70_553_706_496  # seed 002; tests/test_policies_model_fits.py works it out from the shape
# LoRA r = 16 on every linear: 80 layers x 16 x (in + out) of q, o, k, v, gate, up, down
LLAMA70_LORA = 80 * 16 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 3 * (8192 + 28672))
L40S_REPORTED_GIB = 44.99


def _variant(stack: str, method: str):
    """The stack with its own run config and Llama-3.1-70B by `method`, as `ftstack plan --compare` prices it."""
    from infra.cost.method_comparison import with_method

    cfg = load_stack_config(stack, ROOT / "stacks")
    return cfg, with_method(load_run(cfg, ROOT), "hub:meta-llama/Llama-3.1-70B-Instruct", method)


def _batches(cfg, run, nodes: int) -> tuple[int, int]:
    """(micro-batch tokens, accumulation) the batch planner gives the run on `nodes` nodes: inputs to the figures."""
    from planning.placement import decide_placement

    batches = decide_placement(run, shape_for_source(run.model.source), _hardware(cfg), nodes).batches
    return batches.micro_batch_tokens, batches.gradient_accumulation_steps


def _hardware(cfg):
    from planning import catalog
    from planning.placement import Hardware

    w = cfg.nodes.workers[0]
    return Hardware(gpu_memory_gib=catalog.get_platform(w.platform).usable_gpu_memory_gib,
                    gpus_per_node=w.shape.gpus, host_memory_gib=w.shape.ram_gib)


def _speeds(cfg, run) -> dict[int, float | None]:
    """Tokens/s of the whole run on each node count of the stack's worker set (None: does not fit)."""
    from planning import catalog
    from planning.time_model import seconds_per_token
    from planning.throughput import training_throughput
    from planning.placement import decide_placement

    w, shape = cfg.nodes.workers[0], shape_for_source(run.model.source)
    tps = training_throughput(cfg.plan_stack(), run).tokens_per_second_per_gpu
    speeds: dict[int, float | None] = {}
    for nodes in range(1, w.size + 1):
        placed = decide_placement(run, shape, _hardware(cfg), nodes)
        seconds = seconds_per_token(run, shape, placed, w.platform, catalog.get_platform(w.platform).gpu_model, tps)
        speeds[nodes] = 1 / seconds if placed.fits and seconds else None
    return speeds


def test_choose_nodes_takes_the_fewest_that_fit_and_more_only_where_faster():
    from planning.placement import choose_nodes

    cfg, run = _variant("demo", "lora")
    shape, hardware = shape_for_source(run.model.source), _hardware(cfg)
    times = {1: 4.0, 2: 3.0, 3: 3.0, 4: None, 5: 5.0}
    assert choose_nodes(run, shape, hardware, 5, lambda p: times[p.nodes]).nodes == 2  # 3 ties, 4 unknown
    assert choose_nodes(run, shape, hardware, 5, lambda p: None).nodes == 1
    assert choose_nodes(run, shape, hardware, 5, lambda p: 1.0 / p.nodes, fewest_nodes=3).nodes == 5
    full = run.model_copy(update={"train": run.train.model_copy(update={"method": "full"})})
    assert choose_nodes(full, shape, hardware, 5, lambda p: 1.0) is None  # fp32 70B fits no node count of demo


def test_demo_trains_70b_lora_on_one_node_with_offload_not_over_its_ethernet():
    """demo: 5 nodes of 2 L40S, one 1.45 GB/s Ethernet link a node (catalog.FABRICS' measured figure). Per
    micro-batch of 2,048 tokens at the priced tokens/s per GPU (t):
    - 1 node, 2 ranks, CPU offload (nothing else fits 2 GPUs): each rank copies the bf16 base from host memory twice
      over its 32 GB/s PCIe link (no NVLink, so the all-gather crosses it too): 2 x 2 B x 70.55e9 / 32e9 = 8.8 s,
      more than the 2,048 / t = 8.7 s of compute, plus the CPU's AdamW step over the LoRA parameters
      (x 28 B at 460.8 GB/s, once in 8 micro-batches); the all-gather over PCIe, 1/2 x (2 x 2 B x params + 4 B x
      LoRA) / 32e9 = 4.4 s, overlaps it: 2 x 2,048 tokens in ~8.8 s.
    - 5 nodes, 10 ranks, FSDP without offload: 9/10 x (2 x 2 B x params + 4 B x LoRA) / 1.45e9 = 175 s of network
      a micro-batch: 10 x 2,048 tokens in 175 s, a quarter of one node's speed.
    So the trainer is given one node, the plan and the policy say so, and the train job asks Slurm for one."""
    from planning.throughput import training_throughput
    from infra.pipeline.chain import pipeline_jobs, code_location_for

    cfg, run = _variant("demo", "lora")
    assert _batches(cfg, run, 1) == _batches(cfg, run, 5) == (2048, 8)
    tps = training_throughput(cfg.plan_stack(), run).tokens_per_second_per_gpu
    compute = 2048 / tps
    copies = 2 * 2 * LLAMA70_PARAMS / 32e9
    step = LLAMA70_LORA * 28 / 460.8e9 / 8
    one = 2 * 2048 / max(max(compute, copies) + step, (4 * LLAMA70_PARAMS + 4 * LLAMA70_LORA) / 2 / 32e9)
    five = 10 * 2048 / (9 / 10 * (4 * LLAMA70_PARAMS + 4 * LLAMA70_LORA) / 1.45e9)
    assert copies > compute and five < one / 3
    speeds = _speeds(cfg, run)
    assert speeds[1] == pytest.approx(one, rel=1e-2) and speeds[5] == pytest.approx(five, rel=1e-2)
    assert max(speeds, key=lambda n: speeds[n] or 0) == 1

    [fit] = worker_fits(cfg.plan_stack(), run, shape_for_source(run.model.source), plan_tps(cfg, run))
    assert (fit.placement.nodes, fit.placement.plan.strategy, fit.placement.plan.offload) == (1, "fsdp", "params")
    jobs = {j.stage: j for j in pipeline_jobs(cfg, run, cfg.pipeline.run_config, "c", code_location_for(cfg, run, ROOT))}
    assert "--nodes=1" in jobs["train"].extra_args and "--nodes=5" in jobs["readiness"].extra_args


def test_a_run_on_fewer_nodes_is_timed_and_priced_on_those_nodes():
    """demo's 70B LoRA trains on one of the five nodes (2 of 10 L40S): its wall time is its GPU-hours over 2 GPUs,
    not 10, so the train job's time limit (estimate x 1.5 + 30 min) covers it; it pays for the one node it holds.
    The price per GPU-hour the comparison derives (usd / gpu_hours) is the set's own, as before."""
    from infra.cost.price import PriceInputs, price_stack
    from planning.prices import PriceBook, node_price

    cfg, run = _variant("demo", "lora")
    training = price_stack(cfg, PriceInputs(), run=run).training
    assert training is not None and training.gpus == 2
    assert training.wall_hours == pytest.approx(training.gpu_hours / 2)
    [worker] = cfg.nodes.workers
    one_node_hour = node_price(worker.platform, worker.preset, PriceBook(cfg.pricing.overrides),
                               preemptible=worker.preemptible).usd_per_hour
    assert training.usd == pytest.approx(training.wall_hours * one_node_hour)
    assert training.usd / training.gpu_hours == pytest.approx(one_node_hour / 2)


def test_demo_plan_comparison_and_trainer_agree_on_the_70b_lora_placement(tmp_path, monkeypatch):
    """The trainer, started on the one node the job asks for (2 ranks, L40S memory as PyTorch reports it, the
    preset's 384 GiB RAM), places the run as the policy and the plan do; the comparison marks that row chosen."""
    from infra.cost.method_comparison import compare
    from workloads.train import finetune
    from workloads.train import run_plan as job_plan
    from documents.run_plan import PLAN_ENV
    from infra.pipeline.chain import job_plan as job_plan_of
    from infra.plans import stack_plan

    cfg, run = _variant("demo", "lora")
    [fit] = worker_fits(cfg.plan_stack(), run, shape_for_source(run.model.source), plan_tps(cfg, run))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA70_CONFIG))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(job_plan, "gpu_memory_gib", lambda: L40S_REPORTED_GIB)
    pages = {"SC_PHYS_PAGES": 384 * 2**30 // 4096, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(job_plan.os, "sysconf", lambda name: pages[name])
    plan = stack_plan(cfg, run)
    monkeypatch.setenv(PLAN_ENV, job_plan_of(plan).model_dump_json())  # what the chain gives the train job
    trainer, differences = finetune.job_placement(run, model)
    assert differences == []
    assert trainer.model_dump(mode="json") == fit.placement.model_dump(mode="json")

    c = compare(cfg, run)
    [chosen] = [r for r in c.rows if r.chosen and r.params_b == 70.55 and r.method == "lora"]
    assert (chosen.strategy, chosen.offload, chosen.wall_gpus) == ("fsdp", "params", trainer.gpus)


def test_h100_trains_70b_lora_on_both_nodes_over_infiniband():
    """h100: 2 nodes of 8 H100 SXM, a 50 GB/s InfiniBand NIC per GPU. Micro-batch 4,096 tokens at the priced t:
    over 16 ranks a rank moves 15/16 x (2 x 2 B x params + 4 B x LoRA) = 265 GB in 5.3 s, less than the
    4,096 / t = 6.3 s of compute it overlaps: compute-bound, so 16 GPUs train twice as fast as one node's 8."""
    from planning.throughput import training_throughput

    cfg, run = _variant("h100", "lora")
    assert _batches(cfg, run, 1) == _batches(cfg, run, 2) == (4096, 2)
    compute = 4096 / training_throughput(cfg.plan_stack(), run).tokens_per_second_per_gpu
    network = 15 / 16 * (4 * LLAMA70_PARAMS + 4 * LLAMA70_LORA) / 50e9
    assert network < compute
    speeds = _speeds(cfg, run)
    assert speeds[2] == pytest.approx(16 * 4096 / compute, rel=1e-3)
    assert speeds[2] == pytest.approx(2 * speeds[1], rel=1e-3)
    [fit] = worker_fits(cfg.plan_stack(), run, shape_for_source(run.model.source), plan_tps(cfg, run))
    assert (fit.placement.nodes, fit.placement.plan.strategy, fit.placement.plan.offload) == (2, "fsdp", "none")


def test_h100_trains_a_70b_full_fine_tune_offloaded_on_both_nodes():
    """Offload is what fits on 1 or 2 nodes (without, it needs 3: tests/test_policies_model_fits.py). Micro-batch
    4,096 tokens, 2 of them per optimizer step, compute c = 4,096 / t:
    - 1 node: copies (NVLink: own eighth) 2 x 4 B x P / 8 + 4 B x P / 8 over 64 GB/s = 1.7 s < c; the CPU's AdamW
      step over the node's P x 28 B at 307.2 GB/s, 6.4 s, halved over the 2 micro-batches: c + 3.2 s per micro-batch.
    - 2 nodes: the node holds half: c + 1.6 s; the network 15/16 x (2 x 2 B + 4 B) x P over 50 GB/s = 10.6 s is
      longer and bounds it: 16 x 4,096 tokens in 10.6 s against 8 x 4,096 in c + 3.2 s."""
    from planning.throughput import training_throughput

    cfg, run = _variant("h100", "full")
    assert _batches(cfg, run, 1) == _batches(cfg, run, 2) == (4096, 2)
    compute = 4096 / training_throughput(cfg.plan_stack(), run).tokens_per_second_per_gpu
    step = LLAMA70_PARAMS * 28 / 307.2e9
    one = 8 * 4096 / (compute + step / 2)
    two = 16 * 4096 / max(compute + step / 2 / 2, 15 / 16 * 8 * LLAMA70_PARAMS / 50e9)
    speeds = _speeds(cfg, run)
    assert (speeds[1], speeds[2]) == (pytest.approx(one, rel=1e-2), pytest.approx(two, rel=1e-2))
    [fit] = worker_fits(cfg.plan_stack(), run, shape_for_source(run.model.source), plan_tps(cfg, run))
    assert (fit.placement.nodes, fit.placement.plan.strategy, fit.placement.plan.offload) == (2, "fsdp", "params")


def test_demo_refuses_a_70b_full_fine_tune_and_the_job_keeps_every_node():
    """fp32 70B (16 B a parameter sharded, 1.13 TB) fits no node count of demo's 5 x 2 L40S, offload or not (host RAM
    384 GiB a node): the policy refuses, and the train job's node count stays the worker set's."""
    from infra.plans import stack_plan

    cfg, run = _variant("demo", "full")
    assert set(_speeds(cfg, run).values()) == {None}
    [fit] = worker_fits(cfg.plan_stack(), run, shape_for_source(run.model.source), plan_tps(cfg, run))
    assert not fit.fits and fit.placement.nodes == 5
    assert stack_plan(cfg, run).stages["train"].nodes == 5
    assert rules.model_fits(Context([], cfg, run, {}))
