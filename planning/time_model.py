"""The time model of a training run on a worker set: bytes and seconds on the network per micro-batch
(``NETWORK_MODEL``), the node count it trains fastest on (``NODES_MODEL``: ``fastest_nodes``, the datasheet roofline
where no throughput is known) and the cost of FSDP's CPU offload (``OFFLOAD_MODEL``). The method comparison, the fit
and the train job's node count all use it."""

from __future__ import annotations

from documents.run_config import RunConfig
from documents.train_plan import BatchPlan
from planning import catalog
from planning.throughput import Plan
from planning.memory import DTYPE_BYTES, inputs_from_run, lora_params, weight_bytes
from planning.model_shapes import ModelShape
from planning.placement import Hardware, Placement, choose_nodes


NETWORK_MODEL = (
    "per micro-batch and rank, on the nodes the row trains on (the stack's, else the whole nodes it needs) with the "
    "strategy decide_placement takes there: FSDP all-gathers the weights twice (forward, backward) in the compute "
    "dtype (a 4-bit base as stored) and reduce-scatters the trainable gradients in fp32, each x (n-1)/n of the "
    "bytes; DDP all-reduces the trainable gradients (2 x fp32 x (n-1)/n) once per optimizer step; HSDP does FSDP's "
    "within each node of g GPUs and all-reduces each rank's 1/g of the fp32 gradients across the N nodes "
    "(2 x (N-1)/N), every GPU of a node at once; within a node over the peer link (catalog.HOST_LINKS: NVLink or "
    "PCIe), across nodes a ring at the fabric's link (catalog.FABRICS: a GPU's own InfiniBand NIC, or the node's "
    "one Ethernet link), HSDP's two phases one after the other; overlapped with compute, so throughput is divided "
    "by max(1, network time / compute time); latency not counted")


def trainable_params(run: RunConfig, shape: ModelShape) -> int:
    inputs = inputs_from_run(run)
    if inputs.method == "full":
        return shape.params
    return lora_params(shape, inputs.lora_r, inputs.lora_target_modules)


def gathered_bytes(run: RunConfig, shape: ModelShape) -> float:
    """The weights as an all-gather moves them: the compute dtype, a 4-bit base as stored."""
    inputs = inputs_from_run(run)
    return weight_bytes(shape, inputs) if inputs.method == "qlora" else shape.params * DTYPE_BYTES[inputs.dtype]


def network_bytes(run: RunConfig, shape: ModelShape, strategy: str, ranks: int, accumulation: int) -> float:
    """Bytes one rank moves per micro-batch under FSDP or DDP over `ranks` (``NETWORK_MODEL``)."""
    if ranks <= 1:
        return 0.0
    share = (ranks - 1) / ranks
    trainable = trainable_params(run, shape)
    if strategy == "fsdp":
        return share * (2 * gathered_bytes(run, shape) + 4 * trainable)
    return share * 2 * 4 * trainable / accumulation


def hsdp_bytes(run: RunConfig, shape: ModelShape, nodes: int, gpus_per_node: int) -> tuple[float, float]:
    """(within its node, across nodes): bytes one rank moves per micro-batch under HSDP (``NETWORK_MODEL``)."""
    g = gpus_per_node
    within = (g - 1) / g * (2 * gathered_bytes(run, shape) + 4 * trainable_params(run, shape))
    across = 2 * (nodes - 1) / nodes * 4 * trainable_params(run, shape) / g
    return within, across


def network_seconds(run: RunConfig, shape: ModelShape, strategy: str, nodes: int, gpus_per_node: int,
                    accumulation: int, platform: str, gpu_model: str) -> tuple[float, float | None]:
    """(bytes one rank moves per micro-batch, the seconds they take; None where a link has no figure)."""
    peer = catalog.HOST_LINKS[gpu_model].peer_gb_per_s * 1e9
    fabric = catalog.FABRICS[platform]
    if strategy == "hsdp":
        within, across = hsdp_bytes(run, shape, nodes, gpus_per_node)
        node_link = fabric.node_gb_per_s(gpus_per_node)
        if across and node_link is None:
            return within + across, None
        crossing = across * gpus_per_node / (node_link * 1e9) if across and node_link else 0.0
        return within + across, within / peer + crossing
    moved = network_bytes(run, shape, strategy, nodes * gpus_per_node, accumulation)
    if nodes == 1:
        return moved, moved / peer
    ring = fabric.ring_gb_per_s
    return moved, None if ring is None else moved / (ring * 1e9)


def compute_bound(shape: ModelShape, gpu_model: str, micro_batch_tokens: int) -> str:
    plan = Plan(gpu_model=gpu_model, shape=shape, micro_batch_tokens=micro_batch_tokens, recompute=False)
    return "compute" if plan.intensity() >= catalog.gpu_peaks(gpu_model).ridge_flop_per_byte else "memory"


NODES_MODEL = (
    "how many of a worker set's nodes a run trains on (choose_nodes): the fewest whole nodes where decide_placement "
    "fits (offload under auto where nothing else fits there), more only where they train faster: a micro-batch "
    "computes at the tokens/s per GPU the stack prices the run with (a configured, measured, borrowed or estimated "
    "figure; without one, the GPU's datasheet roofline: the larger of FLOPs per token over dense bf16 FLOP/s and "
    "weight bytes per token over memory bandwidth, QLoRA's dequantization added, estimate.Plan), slowed by "
    "OFFLOAD_MODEL where it offloads, overlapped with its network time (NETWORK_MODEL): seconds per token = "
    "max(that, network) over the micro-batch's tokens x the GPUs; a tie, or a fabric without a figure, keeps the "
    "fewer nodes")


def roofline_tokens_per_second(run: RunConfig, shape: ModelShape, gpu_model: str, batches: BatchPlan) -> float:
    """Tokens/s of one GPU at its datasheet peaks for `batches`' micro-batch (``NODES_MODEL``)."""
    method = inputs_from_run(run).method
    plan = Plan(gpu_model=gpu_model, shape=shape, micro_batch_tokens=batches.micro_batch_tokens,
                recompute=batches.gradient_checkpointing, full=method == "full", qlora=method == "qlora")
    peaks = catalog.gpu_peaks(gpu_model)
    seconds = max(plan.flops_per_token() / (peaks.bf16_dense_tflops * 1e12),
                  plan.weight_bytes_per_token() / (peaks.memory_tb_per_s * 1e12))
    return plan.micro_batch_tokens / (seconds * plan.micro_batch_tokens + plan.dequant_seconds())


def seconds_per_token(run: RunConfig, shape: ModelShape, placed: Placement, platform: str, gpu_model: str,
                      tokens_per_second_per_gpu: float | None) -> float | None:
    """Wall seconds per training token of the whole run on `placed` (``NODES_MODEL``); None when not known."""
    if (placed.batches is None or gpu_model not in catalog.HOST_LINKS or gpu_model not in catalog.GPU_PEAKS
            or platform not in catalog.FABRICS):
        return None
    batches = placed.batches
    tps = tokens_per_second_per_gpu or roofline_tokens_per_second(run, shape, gpu_model, batches)
    compute = batches.micro_batch_tokens / tps
    if placed.plan.offload != "none":
        if platform not in catalog.HOST_MEMORY:
            return None
        compute *= offload_slowdown(run, shape, gpu_model, platform, placed.gpus, placed.gpus_per_node, batches, tps)
    _, network = network_seconds(run, shape, placed.plan.strategy, placed.nodes, placed.gpus_per_node,
                                 batches.gradient_accumulation_steps, platform, gpu_model)
    if network is None:
        return None
    return max(compute, network) / (batches.micro_batch_tokens * placed.gpus)


def fastest_nodes(run: RunConfig, shape: ModelShape, hardware: Hardware, most_nodes: int, platform: str,
                  gpu_model: str, tokens_per_second_per_gpu: float | None, fewest_nodes: int = 1) -> Placement | None:
    """`choose_nodes` with ``seconds_per_token``: the placement a run trains with on `most_nodes` nodes of a worker
    set (``NODES_MODEL``)."""
    return choose_nodes(run, shape, hardware, most_nodes, lambda placed: seconds_per_token(
        run, shape, placed, platform, gpu_model, tokens_per_second_per_gpu), fewest_nodes)


ADAMW_BYTES_PER_PARAM = 28
"""Host memory traffic of one AdamW update of an fp32 parameter: parameter, gradient and both moments read (16 B),
parameter and moments written (12 B)."""


OFFLOAD_MODEL = (
    "per micro-batch: max(compute, copies) plus the CPU optimizer step over the accumulation steps, against the "
    "compute time; copies: each rank copies its shard of the weights from host memory twice (forward, backward), "
    "and without NVLink (L40S) also receives the other ranks' shards over the same PCIe link (the all-gather), at "
    "catalog.HOST_LINKS' per-direction PCIe bandwidth; a full fine-tune also copies its gradient shard back; copies "
    "overlap compute (FSDP prefetches a layer ahead); the optimizer step runs on the CPU over the offloaded fp32 "
    "shards while the GPUs wait: a node's trainable parameters x 28 B (AdamW reads parameter, gradient and two "
    "moments, writes three) at one socket's peak memory bandwidth (catalog.HOST_MEMORY; a VM gets at most that, so "
    "a lower bound); an offload row over several nodes also overlaps its network time (NETWORK_MODEL)")


def cpu_step_seconds(run: RunConfig, shape: ModelShape, platform: str, ranks: int, gpus_per_node: int) -> float:
    """Seconds of one optimizer step on a node's CPU under FSDP's CPU offload (``OFFLOAD_MODEL``)."""
    on_node = trainable_params(run, shape) * min(gpus_per_node, ranks) / ranks
    return on_node * ADAMW_BYTES_PER_PARAM / (catalog.HOST_MEMORY[platform].gb_per_s * 1e9)


def offload_slowdown(run: RunConfig, shape: ModelShape, gpu_model: str, platform: str, ranks: int,
                     gpus_per_node: int, batches: BatchPlan, tokens_per_second: float) -> float:
    """The throughput divisor of FSDP's CPU offload (``OFFLOAD_MODEL``)."""
    inputs = inputs_from_run(run)
    link = catalog.HOST_LINKS[gpu_model]
    stored = weight_bytes(shape, inputs)
    moved = 2 * stored * (1 / ranks if link.nvlink else 1)
    if inputs.method == "full":
        moved += 4 * shape.params / ranks
    copy = moved / (link.pcie_gb_per_s * 1e9)
    compute = batches.micro_batch_tokens / tokens_per_second
    step = cpu_step_seconds(run, shape, platform, ranks, gpus_per_node) / batches.gradient_accumulation_steps
    return max(1.0, (max(compute, copy) + step) / compute)
