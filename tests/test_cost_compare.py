"""`ftstack plan --compare`: each method x each known model size on the stack's GPU model, priced from the same
throughput source as the stack's training-run cost. Expected figures are computed here by hand from the price
catalog's published figures and the bench's measured row."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from documents.throughput import bench_throughputs
from infra.config import load_stack_config
from infra.cost.method_comparison import METHODS, compare, plot_comparison, render_comparison
from infra.cost.price import PriceInputs
from infra.config import load_run

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024**3
LLAMA70_LORA = "workloads/configs/h100-llama-3.1-70b-lora.json"
BENCH_H100_QWEN14_QLORA = next(f for f in bench_throughputs() if (f.gpu_model, f.model, f.method) ==
                               ("NVIDIA H100 SXM", "hub:Qwen/Qwen3-14B", "qlora") and f.gradient_checkpointing)
BENCH_H100_QWEN14_QLORA_AUTO = next(f for f in bench_throughputs() if (f.gpu_model, f.model, f.method) ==
                                    ("NVIDIA H100 SXM", "hub:Qwen/Qwen3-14B", "qlora") and not f.gradient_checkpointing)
"""the bench rows with and without activation recomputation (the second: the shipped `auto` plan on an H100)"""


def _stack(name: str, run_config: str | None = None, **training):
    cfg = load_stack_config(name, ROOT / "stacks")
    if run_config:
        cfg = cfg.model_copy(update={"pipeline": cfg.pipeline.model_copy(update={"run_config": run_config})})
    if training:
        cfg = cfg.model_copy(update={"pricing": cfg.pricing.model_copy(update={
            "training": cfg.pricing.training.model_copy(update=training)})})
    return cfg


def _compare(cfg):
    return compare(cfg, load_run(cfg, ROOT))


@functools.cache
def _stack_comparison(name: str, run_config: str | None = None):
    """One comparison per stack for the tests that only read it (a comparison prices every row)."""
    return _compare(_stack(name, run_config))


def _row(comparison, model: str, method: str):
    return next(r for r in comparison.rows if (r.model, r.method) == (model, method))


def test_h100_row_of_the_measured_model_matches_a_hand_computation():
    """50,000 rows x 0.9 train x 2,048 tokens = 92,160,000 tokens, one pass; Qwen3-14B QLoRA on an H100 was
    measured at the bench's figure for the plan this run config's `auto` sizing makes there (the bench ran that
    very plan: 3,328-token micro-batches, no recomputation), so 92,160,000 / tps / 3,600 GPU-hours at $2.95 an
    H100-hour on demand and $1.25 preemptible (planning/prices.py's H100 source), over the stack's 16 GPUs."""
    c = _compare(_stack("h100", LLAMA70_LORA))
    tps = BENCH_H100_QWEN14_QLORA_AUTO.tokens_per_second_per_device
    gpu_hours = 92_160_000 / tps / 3600
    row = _row(c, "hub:Qwen/Qwen3-14B", "qlora")
    assert (c.tokens, c.passes, c.stack_gpus, c.gpus_per_node) == (92_160_000, 1, 16, 8)
    assert (c.usd_per_gpu_hour, c.preemptible_usd_per_gpu_hour) == (pytest.approx(2.95), pytest.approx(1.25))
    assert (row.strategy, row.gpus_needed, row.fits_stack) == ("ddp", 1, True)
    assert row.micro_batch_tokens == BENCH_H100_QWEN14_QLORA_AUTO.micro_batch_tokens
    assert row.throughput.kind == "borrowed" and row.throughput.tokens_per_second_per_gpu == tps
    assert row.gpu_hours == pytest.approx(gpu_hours)
    assert row.wall_hours == pytest.approx(gpu_hours / 16)
    assert row.usd_on_demand == pytest.approx(gpu_hours * 2.95)
    assert row.usd_preemptible == pytest.approx(gpu_hours * 1.25)


def test_h100_table_covers_every_method_and_size_and_says_what_needs_more_nodes():
    c = _compare(_stack("h100", LLAMA70_LORA))
    plain = [r for r in c.rows if r.offload == "none" and r.opt_in is None]  # offload and hsdp rows follow theirs
    models = [r.model for r in plain[::3]]
    assert models == ["hub:meta-llama/Llama-3.1-8B", "hub:Qwen/Qwen3-8B", "hub:Qwen/Qwen3-14B", "hub:Qwen/Qwen3-32B",
                      "hub:meta-llama/Llama-3.1-70B"]
    assert [r.method for r in plain] == list(METHODS) * len(models)
    # full 70B: 16 B/parameter sharded; 16 H100s hold only 16 x 70.55e9 / 16 B = 65.7 GiB of the 71.3 GiB each
    # before the 7.1 GiB of gathered bf16 layers and root, so it needs more GPUs than the stack has
    full70 = _row(c, "hub:meta-llama/Llama-3.1-70B", "full")
    assert full70.strategy == "fsdp" and full70.gpus_needed > 16 and not full70.fits_stack
    lora70 = _row(c, "hub:meta-llama/Llama-3.1-70B", "lora")
    assert lora70.strategy == "fsdp" and 2 <= lora70.gpus_needed <= 16 and lora70.fits_stack  # 141 GB bf16 base
    text = render_comparison(c)
    assert text.startswith("Method comparison on NVIDIA H100 SXM (79.19 GiB usable; stack 'h100': 16 GPUs, $2.95/GPU-hour, "
                           "preemptible $1.25) for 92,160,000 training tokens")
    assert "no: 3 nodes" in text and "  borrowed\n" in text and "figure: 3,195 tokens/s per GPU measured" in text


def test_demo_table_renders_with_the_l40s_price_and_an_estimated_throughput():
    """gpu-l40s-d 2gpu-64vcpu-384gb: 2 x $1.35 + 64 x $0.01 + 384 GiB x $0.0032 an hour (seed 000), per GPU. Qwen3-14B
    QLoRA was measured on an H100 only: on an L40S it is that figure x 362.05 / 989.4 dense bf16 TFLOP/s (the
    datasheets; the bench ran compute-bound at 16,384-token micro-batches, recomputing like demo.json)."""
    c = _compare(_stack("demo"))
    per_gpu_hour = (2 * 1.35 + 64 * 0.01 + 384 * 0.0032) / 2
    assert c.usd_per_gpu_hour == pytest.approx(per_gpu_hour)
    row = _row(c, "hub:Qwen/Qwen3-14B", "qlora")
    tps = BENCH_H100_QWEN14_QLORA.tokens_per_second_per_device
    assert row.throughput.kind == "estimated" and row.throughput.ratio == pytest.approx(362.05 / 989.4)
    assert row.throughput.tokens_per_second_per_gpu == pytest.approx(tps * 362.05 / 989.4)
    assert row.usd_on_demand == pytest.approx(92_160_000 / (tps * 362.05 / 989.4) / 3600 * per_gpu_hour)
    assert c.preemptible_usd_per_gpu_hour is None and all(r.usd_preemptible is None for r in c.rows)
    assert (c.gpu_model, c.stack_gpus, c.tokens) == ("NVIDIA L40S", 10, 92_160_000)
    assert _row(c, "hub:Qwen/Qwen3-14B", "qlora").strategy == "ddp"
    assert _row(c, "hub:meta-llama/Llama-3.1-70B", "lora").strategy == "fsdp"
    text = render_comparison(c)
    assert "NVIDIA L40S (44.99 GiB usable; stack 'demo': 10 GPUs, $2.28/GPU-hour)" in text
    assert "no preemptible price" in text and "estimated x0.366" in text


def test_the_stacks_configured_throughput_prices_only_its_own_model_and_method():
    c = _compare(_stack("demo", tokens_per_second_per_gpu=1000.0))
    own = _row(c, "hub:Qwen/Qwen3-14B", "qlora")
    assert own.throughput.kind == "configured" and own.gpu_hours == pytest.approx(92_160_000 / 1000 / 3600)
    assert all(r.throughput.kind != "configured" for r in c.rows if r is not own)


def test_a_run_measured_on_the_stack_prices_only_its_own_model_and_method():
    cfg = _stack("demo")
    own = BENCH_H100_QWEN14_QLORA.model_copy(update={
        "gpu_model": "NVIDIA L40S", "tokens_per_second_per_device": 1500.0, "origin": "run", "stack": "demo",
        "run_id": "r1"})
    c = compare(cfg, load_run(cfg, ROOT), PriceInputs(training=own, training_read_from="store"))
    row = _row(c, "hub:Qwen/Qwen3-14B", "qlora")
    assert row.throughput.kind == "measured" and row.gpu_hours == pytest.approx(92_160_000 / 1500 / 3600)
    assert all(r.throughput.kind == "estimated" for r in c.rows if r is not row)


def test_the_chart_is_a_png(tmp_path):
    c = _compare(_stack("h100", LLAMA70_LORA))
    plot_comparison(c, tmp_path / "compare.png")
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ftstack_plan_compare_prints_the_table_and_its_json():
    command = [sys.executable, "-m", "infra.commands.cli", "plan", "--stack", "h100", "--compare", "--json"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)["compare"]
    assert doc["tokens"] == 100_000_000 and "reference size" in doc["data_basis"]  # h100.json sets no data.rows
    assert len([r for r in doc["rows"] if r["offload"] == "none" and r["opt_in"] is None]) == 15  # 5 models x 3


# The rows issue 39 names: the GPUs a row needs at the L40S's nominal 48 GiB and at the 44.99 GiB PyTorch reports.
USABLE_ROWS = [("hub:Qwen/Qwen3-32B", "lora", 2, 3), ("hub:Qwen/Qwen3-14B", "full", 7, 8),
               ("hub:meta-llama/Llama-3.1-70B", "lora", 5, 6)]


def _ranks_by_hand(source: str, method: str, gpu_gib: float) -> int:
    """Fewest FSDP ranks whose per-rank peak fits 90 % of `gpu_gib`, solved in closed form from the memory
    formula's terms (planning/memory.py's docstring): the sharded part S (weights, adapter, gradients, Adam
    states, fragmentation on the last two) over n ranks, plus what every rank holds whole, U (root and two decoder
    layers gathered in bf16, activations with their fragmentation, 1 GiB overhead): n = ceil(S / (budget - U)).
    Weights, adapter and gathered bytes come from the shape by hand; the activation terms from the estimate
    (checked against measured tensors in tests/test_memory_estimate.py)."""
    from infra.cost.method_comparison import with_method
    from planning.memory import estimate
    from planning.parallelism import fit_inputs
    from planning.model_shapes import shape_for_source

    run = with_method(load_run(_stack("demo"), ROOT), source, method)
    shape, inputs = shape_for_source(source), fit_inputs(run)
    per_layer = {name: i * o for name, (i, o) in shape.linears().items()}
    layer_linear = sum(per_layer.values())
    if method == "full":
        trainable, weights, lora = shape.params, 4 * shape.params, 0
    else:
        trainable = shape.layers * sum(inputs.lora_r * (i + o) for i, o in shape.linears().values())
        weights, lora = 2 * shape.params, 4 * trainable
    fragmentation = 0.10
    sharded = weights + lora + (1 + fragmentation) * 12 * trainable        # fp32 gradient + two fp32 Adam states
    whole = estimate(shape, inputs)
    gathered = 2 * shape.other_params + 2 * 2 * layer_linear
    unsharded = (gathered + (1 + fragmentation) * (whole.activations + max(whole.recompute, whole.logits))
                 + 1.0 * GIB)
    return math.ceil(sharded / (0.9 * gpu_gib * GIB - unsharded))


@pytest.mark.parametrize(("source", "method", "nominal", "usable"), USABLE_ROWS)
def test_demo_rows_need_the_gpus_the_usable_l40s_memory_gives(source, method, nominal, usable):
    assert (_ranks_by_hand(source, method, 48), _ranks_by_hand(source, method, 44.99)) == (nominal, usable)
    c = _compare(_stack("demo"))
    row = _row(c, source, method)
    assert c.gpu_memory_gib == 44.99
    assert (row.strategy, row.gpus_needed) == ("fsdp", usable)


def test_seed_002s_70b_lora_on_two_gpus_is_an_offload_row_priced_with_its_slowdown():
    """Seed 002: "LoRA 70B 24h x 2 GPU". On demo's L40S nodes (2 GPUs, 384 GiB RAM) with CPU offload, each rank
    copies the whole bf16 base over its PCIe link per pass, forward and backward (no NVLink: the all-gather crosses
    PCIe too): 2 x 141.1 GB at 32 GB/s (the L40S datasheet's 64 GB/s both ways), against the micro-batch's compute
    at the plain row's tokens/s; the CPU's AdamW step over the node's LoRA parameters (LLAMA70_LORA_PARAMS x 28 B at
    the EPYC Genoa socket's 460.8 GB/s, once per optimizer step: at most once per micro-batch) adds to it; the cost
    is the plain row's GPU-hours times that slowdown."""
    c = _stack_comparison("demo")
    plain = _row(c, "hub:meta-llama/Llama-3.1-70B", "lora")
    row = next(r for r in c.rows
               if (r.model, r.method, r.offload) == ("hub:meta-llama/Llama-3.1-70B", "lora", "params"))
    params = 70_553_706_496
    assert (row.gpus_needed, row.strategy, row.fits_stack) == (2, "fsdp", True) and plain.gpus_needed == 6
    copy_s = 2 * 2 * params / 32e9
    step_s = LLAMA70_LORA_PARAMS * 28 / 460.8e9
    base_tps = plain.throughput.tokens_per_second_per_gpu * (plain.network_slowdown or 1.0)
    compute_s = row.micro_batch_tokens / base_tps
    without_step = max(compute_s, copy_s) / compute_s
    assert without_step < row.slowdown <= (max(compute_s, copy_s) + step_s) / compute_s
    assert row.gpu_hours == pytest.approx(plain.gpu_hours / (plain.network_slowdown or 1.0) * row.slowdown)
    assert "lora    fsdp+offload (chosen)  2" in render_comparison(c)


def test_the_cpu_optimizer_step_of_a_70b_full_fine_tune_offloaded_to_one_h100_node():
    """Seed 002's 70B full fine-tune on 8 GPUs needs offload; the optimizer step then runs on the host over every
    fp32 parameter of the node: 70,553,706,496 x 28 B (AdamW: parameter, gradient and two moments read, three
    written) at the Sapphire Rapids socket's 8 x 4,800 MT/s x 8 B = 307.2 GB/s, 6.4 s, once per optimizer step."""
    from infra.cost.method_comparison import with_method
    from planning.time_model import cpu_step_seconds, offload_slowdown
    from documents.train_plan import BatchPlan
    from planning.model_shapes import shape_for_source

    params = 70_553_706_496
    shape = shape_for_source("hub:meta-llama/Llama-3.1-70B")
    run = with_method(load_run(_stack("h100", LLAMA70_LORA), ROOT), "hub:meta-llama/Llama-3.1-70B", "full")
    step_s = params * 28 / (8 * 4800e6 * 8)
    assert cpu_step_seconds(run, shape, "gpu-h100-sxm", 8, 8) == pytest.approx(step_s)
    batches = BatchPlan(micro_batch_tokens=16_384, gradient_accumulation_steps=4, gradient_checkpointing=True,
                        step_tokens=8 * 4 * 16_384, estimate_gib=None, gpu_memory_gib=79.19, memory_fraction=0.9,
                        source="auto")
    # copies per micro-batch and rank (NVLink peers): 2 passes x its eighth of the fp32 masters, plus its eighth of
    # the fp32 gradients back, at 64 GB/s; compute 16,384 tokens at 500 tokens/s
    copy_s = (2 * 4 * params / 8 + 4 * params / 8) / 64e9
    compute_s = 16_384 / 500.0
    expected = (max(compute_s, copy_s) + step_s / 4) / compute_s
    assert offload_slowdown(run, shape, "NVIDIA H100 SXM", "gpu-h100-sxm", 8, 8, batches, 500.0) == \
        pytest.approx(expected)


def test_a_70b_full_fine_tune_over_three_h100_nodes_is_priced_at_the_fabrics_rate():
    """It needs more than the stack's 16 GPUs, so it trains on 3 whole nodes, 24 ranks talking over InfiniBand,
    400 Gbit/s (50 GB/s) a GPU: per micro-batch a rank receives (n-1)/n of the bf16 weights twice (all-gathers,
    forward and backward) and reduce-scatters (n-1)/n of the fp32 gradients: 8 B a parameter. The row is slowed by
    the ratio of that time to the micro-batch's compute time, when over 1."""
    params = 70_553_706_496
    c = _stack_comparison("h100", LLAMA70_LORA)
    row = _row(c, "hub:meta-llama/Llama-3.1-70B", "full")
    n = row.wall_gpus
    moved = (n - 1) / n * (2 * 2 * params + 4 * params)
    assert row.gpus_needed > 16 and n == 24
    assert row.network_bytes == pytest.approx(moved)
    base_tps = row.throughput.tokens_per_second_per_gpu * row.network_slowdown
    ratio = moved / 50e9 / (row.micro_batch_tokens / base_tps)
    assert row.network_slowdown == pytest.approx(max(1.0, ratio))
    assert row.bound == ("network" if ratio > 1 else "compute")
    one_node = _row(c, "hub:Qwen/Qwen3-14B", "qlora")  # DDP on the stack's 16 GPUs: gradients once a step
    assert one_node.gpus_needed == 1 and one_node.bound in ("compute", "memory")


# Llama-3.1-70B's LoRA parameters at r = 16 on every linear: 80 layers x 16 x (in + out) of q, o (8,192 + 8,192),
# k, v (8,192 + 1,024) and gate, up, down (8,192 + 28,672).
LLAMA70_LORA_PARAMS = 80 * 16 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 3 * (8192 + 28672))


def test_demos_l40s_nodes_talk_over_the_measured_ethernet_figure():
    """Nebius' L40S VMs have no InfiniBand; two of them measured 1.45 GB/s NCCL bus bandwidth over TCP (the
    catalog's source). demo trains the 70B LoRA on its 10 GPUs (5 nodes of 2), FSDP over every rank: per micro-batch
    a rank moves 9/10 of the bf16 weights twice and of the fp32 LoRA gradients once, a ring through each node's one
    link: network-bound at 1.45e9 x micro-batch tokens / those bytes."""
    params = 70_553_706_496
    c = _stack_comparison("demo")
    row = _row(c, "hub:meta-llama/Llama-3.1-70B", "lora")
    moved = 9 / 10 * (2 * 2 * params + 4 * LLAMA70_LORA_PARAMS)
    assert row.wall_gpus == 10 and row.bound == "network"
    assert row.network_bytes == pytest.approx(moved)
    assert row.throughput.tokens_per_second_per_gpu == pytest.approx(1.45e9 * row.micro_batch_tokens / moved)
    assert not any("network unknown" in (r.bound or "") for r in c.rows)


def test_an_hsdp_row_follows_a_multi_node_fsdp_row_whose_shards_fit_one_node():
    """h100's 70B LoRA needs 3 GPUs, so one node holds its shards, yet it trains on the stack's 16 GPUs (2 nodes),
    where auto shards over all 16. The HSDP row (opt in: train.parallelism: hsdp) shards within each node of 8 and
    replicates across the 2: per micro-batch a rank moves 7/8 of the bf16 weights twice and of its fp32 LoRA gradients over NVLink
    (450 GB/s), then all-reduces its eighth of the gradients across the nodes, 2 x 1/2 x 4 B x LoRA / 8, the node's 8
    GPUs at once over its 8 InfiniBand links (8 x 50 GB/s)."""
    params, lora = 70_553_706_496, LLAMA70_LORA_PARAMS
    c = _stack_comparison("h100", LLAMA70_LORA)
    rows = [r for r in c.rows if (r.model, r.method) == ("hub:meta-llama/Llama-3.1-70B", "lora")]
    fsdp, hsdp = rows[0], next(r for r in rows if r.strategy == "hsdp")
    assert hsdp.opt_in == "train.parallelism: hsdp" and fsdp.opt_in is None
    assert fsdp.strategy == "fsdp" and hsdp.gpus_needed == 16
    assert fsdp.network_bytes == pytest.approx(15 / 16 * (2 * 2 * params + 4 * lora))
    within = 7 / 8 * (2 * 2 * params + 4 * lora)
    across = 2 * (1 / 2) * 4 * lora / 8
    assert hsdp.network_bytes == pytest.approx(within + across)
    seconds = within / 450e9 + across * 8 / (8 * 50e9)
    base_tps = fsdp.throughput.tokens_per_second_per_gpu * fsdp.network_slowdown
    assert hsdp.network_slowdown == pytest.approx(max(1.0, seconds / (hsdp.micro_batch_tokens / base_tps)))
    text = render_comparison(c)
    assert "hsdp (opt-in)" in text and "(plan)" not in text and "set train.parallelism: hsdp" in text


def test_hsdp_on_demo_crosses_ethernet_with_gradients_only():
    """demo's 70B QLoRA fits one node's 2 L40S (FSDP), so on its 5 nodes an HSDP row follows: across nodes only each
    rank's half of the fp32 LoRA gradients, 2 x 4/5 x 4 B x LoRA / 2, the node's link carrying both ranks' at
    1.45 GB/s; FSDP over the 10 ranks would send 9/10 of the 4-bit weights twice through the same link, so the FSDP
    row trains on one node (over PCIe, not network-bound) and the HSDP row on the 5 is never dearer."""
    c = _stack_comparison("demo")
    rows = [r for r in c.rows if (r.model, r.method) == ("hub:meta-llama/Llama-3.1-70B", "qlora")]
    fsdp, hsdp = rows[0], next(r for r in rows if r.strategy == "hsdp")
    assert (fsdp.strategy, fsdp.gpus_needed, fsdp.wall_gpus, hsdp.gpus_needed) == ("fsdp", 2, 2, 10)
    assert fsdp.chosen and not hsdp.chosen and fsdp.bound != "network"
    assert hsdp.opt_in and hsdp.usd_on_demand <= fsdp.usd_on_demand
    across = 2 * (4 / 5) * 4 * LLAMA70_LORA_PARAMS / 2
    assert hsdp.network_bytes > across  # plus the within-node all-gathers over PCIe
