"""Model-fits at preview, with sharding: the policy and `ftstack plan` say for each worker set whether the run trains
DDP or FSDP, the per-GPU estimate and, when nothing fits, the smallest node count that does. Expected figures are
worked out by hand from Llama-3.1-70B's published shape (hidden 8,192, 80 layers, 64 heads of 128, 8 KV heads,
intermediate 28,672, vocab 128,256, untied), not read from the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from documents.run_config import RunConfig
from infra.config import StackConfig, load_stack_config
from infra.cost.method_comparison import with_method
from infra.config import load_run
from infra.plans import stack_plan
from planning.fit import planned_throughput, worker_fits
from policies import rules
from policies.rules import Context
from planning.model_shapes import shape_for_source

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024**3
LLAMA70 = "hub:meta-llama/Llama-3.1-70B-Instruct"

# Llama-3.1-70B by hand: per layer q, o 8192x8192; k, v 8192x1024; gate, up, down 8192x28672
LAYER_LINEAR = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672           # 855,638,016
ROOT_PARAMS = 2 * 128256 * 8192 + (2 * 80 + 1) * 8192                           # embeddings, LM head, norms
PARAMS = 80 * LAYER_LINEAR + ROOT_PARAMS                                        # 70,553,706,496 (seed 002)
GATHERED_BF16 = ROOT_PARAMS * 2 + 2 * LAYER_LINEAR * 2                          # root + two layers in use, bf16


def plan_tps(cfg: StackConfig, run: RunConfig) -> float | None:
    """The throughput the run's plan chooses its training nodes at (the preview's `worker_fits` gets the same)."""
    return planned_throughput(stack_plan(cfg, run))


def _run(stack: str, method: str, parallelism: str = "auto", source: str = LLAMA70):
    run = with_method(load_run(load_stack_config(stack, ROOT / "stacks"), ROOT), source, method)
    return run.model_copy(update={"train": run.train.model_copy(update={"parallelism": parallelism})})


def _ctx(stack: str, run) -> Context:
    return Context([], load_stack_config(stack, ROOT / "stacks"), run, {})


def test_hand_figures_match_the_published_parameter_count():
    assert PARAMS == 70_553_706_496


def test_70b_lora_with_ddp_forced_on_demo_is_refused_naming_the_reason():
    """bf16 base alone: 2 x 70.55e9 B = 131.4 GiB on every L40S under DDP, three times 90 %
    of the 44.99 GiB PyTorch reports."""
    run = _run("demo", "lora", "ddp")
    [message] = rules.model_fits(_ctx("demo", run))
    assert message.startswith(f"lora of {LLAMA70}: worker set worker (5 x 2 NVIDIA L40S, 44.99 GiB usable each): "
                              "ddp over 10 GPUs")
    assert "does not fit" in message and "one whole replica" in message and "40.5 GiB" in message
    assert "with train.parallelism auto or fsdp: fsdp" in message
    stack = load_stack_config("demo", ROOT / "stacks")
    [fit] = worker_fits(stack.plan_stack(), run, shape_for_source(LLAMA70), plan_tps(stack, run))
    assert fit.placement.plan.per_rank_bytes["base_weights"] == 2 * PARAMS
    assert fit.placement.per_gpu_gib > 2 * PARAMS / GIB > 0.9 * 44.99


def test_70b_lora_on_demo_is_accepted_on_one_node_and_shards_over_ten_gpus_where_given_them():
    """Accepted, on one node of 2 with CPU offload (tests/test_train_placement.py works out why: over the 5 nodes'
    Ethernet it is network-bound); over all 10 GPUs, what a job given the 5 nodes would do, it shards without."""
    from planning.placement import Hardware, decide_placement

    run = _run("demo", "lora")
    assert rules.model_fits(_ctx("demo", run)) == []
    stack = load_stack_config("demo", ROOT / "stacks")
    [fit] = worker_fits(stack.plan_stack(), run, shape_for_source(LLAMA70), plan_tps(stack, run))
    assert (fit.placement.nodes, fit.placement.plan.offload, fit.set_nodes, fit.fits) == (1, "params", 5, True)
    assert fit.describe().startswith("worker set worker (1 of 5 x 2 NVIDIA L40S")
    spread = decide_placement(run, shape_for_source(LLAMA70), Hardware(gpu_memory_gib=44.99, gpus_per_node=2,
                                                                      host_memory_gib=384), nodes=5)
    plan = spread.plan
    assert (plan.strategy, plan.world_size, spread.gpus, spread.fits, plan.offload) == ("fsdp", 10, 10, True, "none")
    assert plan.per_rank_bytes["base_weights"] == 2 * PARAMS // 10
    assert plan.per_rank_bytes["gathered_weights"] == GATHERED_BF16
    assert 2 * PARAMS / 10 / GIB < spread.per_gpu_gib <= 0.9 * 44.99


def test_70b_full_fine_tune_on_h100_names_the_smallest_node_count():
    """fp32 masters, gradients and two Adam states: 16 B per parameter, sharded. Over 2 nodes (16 H100s) those
    alone are 16 x 70.55e9 / 16 B = 65.7 GiB; with the bf16 root and two gathered layers (7.1 GiB) that is past
    90 % of 79.19 GiB (71.3 GiB) before any activation. Over 3 nodes (24): 43.8 + 7.1 GiB, leaving 20 GiB."""
    assert (16 * PARAMS / 16 + GATHERED_BF16) / GIB > 0.9 * 79.19
    assert (16 * PARAMS / 24 + GATHERED_BF16) / GIB < 0.9 * 79.19 - 20
    auto = _run("h100", "full")
    assert rules.model_fits(_ctx("h100", auto)) == []  # offload auto: nothing else fits 16 GPUs, offloaded it does
    stack = load_stack_config("h100", ROOT / "stacks")
    [fit] = worker_fits(stack.plan_stack(), auto, shape_for_source(LLAMA70), plan_tps(stack, auto))
    assert (fit.placement.plan.offload, fit.placement.gpus) == ("params", 16)
    run = auto.model_copy(update={"train": auto.train.model_copy(update={"offload": "none"})})
    [message] = rules.model_fits(_ctx("h100", run))
    assert "fsdp over 16 GPUs" in message and "does not fit" in message
    assert "the smallest that fits is 3 node(s), 24 GPUs: fsdp" in message
    stack = load_stack_config("h100", ROOT / "stacks")
    [fit] = worker_fits(stack.plan_stack(), run, shape_for_source(LLAMA70), plan_tps(stack, run))
    assert fit.smallest is not None and fit.smallest.nodes == 3 and fit.smallest.plan.fits


@pytest.mark.parametrize(("stack", "config", "strategy"), [
    ("demo", "demo-qwen3-32b-qlora.json", "ddp"),      # NF4 32.8B: ~18.7 GB of weights, one L40S holds a replica
    ("h100", "h100-llama-3.1-70b-qlora.json", "ddp"),  # NF4 70.6B: 68.45e9 x 0.516 + 2.1e9 x 2 = 39.5 GB
    ("h100", "h100-llama-3.1-70b-lora.json", "fsdp"),  # bf16 70.6B: 141 GB, no single H100
])
def test_shipped_large_run_configs_fit_their_stacks(stack, config, strategy):
    cfg = load_stack_config(stack, ROOT / "stacks")
    pipeline = cfg.pipeline.model_copy(update={"run_config": f"workloads/configs/{config}"})
    cfg = cfg.model_copy(update={"pipeline": pipeline})
    run = load_run(cfg, ROOT)
    assert rules.model_fits(Context([], cfg, run, {})) == []
    [fit] = worker_fits(cfg.plan_stack(), run, shape_for_source(run.model.source), plan_tps(cfg, run))
    assert fit.placement.plan.strategy == strategy and fit.fits


def _ftstack(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.commands.cli", "plan", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_ftstack_plan_with_another_run_config_prints_the_placement_and_prices_it():
    proc = _ftstack("--stack", "h100", "--run-config", "workloads/configs/h100-llama-3.1-70b-lora.json", "--policies")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"Training placement of {LLAMA70} (lora, parallelism auto):" in proc.stdout
    assert "worker set worker (2 x 8 NVIDIA H100 SXM, 79.19 GiB usable each): fsdp over 16 GPUs" in proc.stdout
    # 50,000 rows x 0.9 train x 2,048 tokens, priced with the estimated throughput
    assert re.search(r"Training run \(estimated\): 92,160,000 tokens at [\d.,]+ tokens/s/GPU .* on 16 GPUs, \$[\d,.]+\n",
                     proc.stdout), proc.stdout[-4000:]
    assert "[pass] model-fits-gpu" in proc.stdout
    outside = _ftstack("--stack", "h100", "--run-config", "stacks/Pulumi.h100.yaml")
    assert outside.returncode == 2 and "outside workloads/" in outside.stderr


def _with_workers(cfg, **update):
    workers = [w.model_copy(update=update) for w in cfg.nodes.workers]
    return cfg.model_copy(update={"nodes": cfg.nodes.model_copy(update={"workers": workers})})


def test_host_memory_counts_one_base_on_the_first_node_not_one_per_rank():
    """bf16 70B LoRA over 2 x 8 H100s: rank 0 reads the 141.1 GB base, its 7 node-mates one tensor each at most
    (the 128,256 x 8,192 bf16 embedding, 2.1 GB): 146 GB of the 1,600 GiB node, where a copy per rank was 1.13 TB."""
    run = _run("h100", "lora")
    stack = load_stack_config("h100", ROOT / "stacks")
    [fit] = worker_fits(stack.plan_stack(), run, shape_for_source(LLAMA70), plan_tps(stack, run))
    embedding = 128256 * 8192 * 2
    assert fit.placement.host_bytes_per_node == 2 * PARAMS + 7 * embedding
    assert fit.placement.host_fits and fit.fits
    assert f"host memory {(2 * PARAMS + 7 * embedding) / GIB:.1f} GiB on the busiest node of the node's 1600 GiB RAM" \
        in fit.describe()


def test_a_node_whose_ram_cannot_hold_the_base_is_refused_with_the_figures():
    """A 70B full fine-tune loads fp32 masters: 4 x 70.55e9 B = 262.9 GiB on rank 0's node, over the 200 GiB of a
    1gpu-16vcpu-200gb H100 node, however many such nodes there are (GPU memory would fit on 24)."""
    cfg = _with_workers(load_stack_config("h100", ROOT / "stacks"), preset="1gpu-16vcpu-200gb", size=24)
    run = _run("h100", "full")
    [message] = rules.model_fits(_ctx_of(cfg, run))
    assert f"host memory {4 * PARAMS / GIB:.1f} GiB on the busiest node of the node's 200 GiB RAM: does not fit" \
        in message
    assert "no node count of this preset fits" in message


def _ctx_of(cfg, run) -> Context:
    return Context([], cfg, run, {})


def test_offload_is_chosen_by_auto_only_where_nothing_else_fits():
    """70B LoRA on one demo node (2 L40S): sharded over 2 the bf16 base alone is 65.7 GiB a GPU, over 90 % of 44.99;
    with CPU offload a GPU holds only the gathered root and two layers (7.1 GiB) besides activations. On 3 nodes
    (6 GPUs) it fits without offload, so auto does not offload there."""
    from planning.placement import Hardware, decide_placement

    run = _run("demo", "lora")
    node = Hardware(gpu_memory_gib=44.99, gpus_per_node=2, host_memory_gib=384)
    shape = shape_for_source(LLAMA70)
    assert 2 * PARAMS / 2 / GIB > 0.9 * 44.99 > GATHERED_BF16 / GIB + 1
    two = decide_placement(run, shape, node, nodes=1)
    assert (two.plan.strategy, two.plan.offload, two.fits) == ("fsdp", "params", True)
    assert two.plan.per_rank_bytes["base_weights"] == 0
    assert two.plan.per_rank_bytes["offloaded_to_host"] >= 2 * PARAMS // 2
    # host: rank 0's bf16 base, its peer's tensor in flight, both ranks' offloaded shards
    assert two.host_bytes_per_node >= 2 * PARAMS + 2 * (2 * PARAMS // 2)
    six = decide_placement(run, shape, node, nodes=3)
    assert (six.plan.offload, six.fits) == ("none", True)
    never = run.model_copy(update={"train": run.train.model_copy(update={"offload": "none"})})
    assert not decide_placement(never, shape, node, nodes=1).fits
