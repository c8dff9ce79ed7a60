"""Where and how a run trains: the one decision the trainer, the cost estimate, the method comparison, `ftstack
plan` and the preview's model-fits policy all make through `decide_placement` (pure, no torch at import).

One order, always: the strategy over the ranks first (`planning.parallelism.decide_parallelism`: DDP while a
replica fits `memory_fraction` of the GPU, FSDP over every rank otherwise), then the micro-batch, accumulation and
checkpointing over that strategy's shards (`planning.batches.plan_batches`). Given a node count the decision
is made for it (the trainer: the nodes Slurm gave it; the policy: the stack's worker set); without one it is the
fewest whole nodes on which it fits (the comparison, the estimate, the policy's advice). A run that forces DDP is
searched as FSDP there, and the placement says so (`needs_sharding`); its config is not rewritten. How many of a
worker set's nodes a run is given is `choose_nodes`: the fewest whole nodes on which it fits (with offload when that
is what fits there), more only where a caller's time model (the network and offload estimate of
`infra.cost.method_comparison`) says they train faster. FSDP's CPU
offload is used when `train.offload: params`, and under `auto` only on a given node count where nothing else fits
and the run allows FSDP (the search never needs it: more nodes fit without it).

Host memory per node (`host_bytes_per_node`) is counted against the node's RAM when it is known: under FSDP an
unquantized base is read into host memory by rank 0 only (`workloads.train.sharding.shard_from_rank0`): the first
node holds the whole base at its load dtype (fp32 masters for a full fine-tune, the compute dtype for LoRA) while
its other ranks hold one tensor in flight; under DDP, and for a quantized base, every rank streams the weights
from the safetensors files to its GPU, one tensor at a time (`largest_tensor_bytes` each). CPU offload adds every
rank's offloaded shards. HSDP (`train.parallelism: hsdp`, never chosen by `auto`) loads as FSDP does (rank 0 reads the
base and broadcasts it into every rank's shards), its GPU memory is FSDP's over one shard group, and it trains on
node counts whose ranks are whole shard groups (`hsdp_nodes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from documents.train_plan import Batching, BatchPlan, ParallelismPlan
from planning.memory import DTYPE_BYTES, GIB, inputs_from_run
from planning.model_shapes import ModelShape
from planning.parallelism import decide_parallelism
from planning.batches import DoesNotFit, plan_batches

if TYPE_CHECKING:
    from documents.run_config import RunConfig


class Hardware(BaseModel):
    """What a placement is decided on: one GPU's usable memory (None: CPU) and the GPUs of one node."""

    model_config = ConfigDict(frozen=True)

    gpu_memory_gib: float | None = Field(description="memory of one GPU as PyTorch reports it (planning.catalog)")
    gpus_per_node: int = Field(1, ge=1, description="ranks per node")
    host_memory_gib: float | None = Field(None, description="RAM of one node (the preset's); None: not checked")


class Placement(BaseModel):
    """The decision: nodes, ranks, strategy and the batch plan over them."""

    model_config = ConfigDict(frozen=True)

    nodes: int
    gpus_per_node: int
    plan: ParallelismPlan
    batches: BatchPlan | None
    """None when not even one sequence per micro-batch fits (`why_not` says by how much)."""
    why_not: str | None = None
    needs_sharding: bool = False
    """the run forces DDP and this placement is what FSDP (train.parallelism auto or fsdp) would need."""
    host_bytes_per_node: int | None = None
    """host memory the busiest node needs while the base loads (None: model shape unknown)."""
    host_memory_gib: float | None = None

    @property
    def host_fits(self) -> bool:
        return (self.host_bytes_per_node is None or self.host_memory_gib is None
                or self.host_bytes_per_node <= self.host_memory_gib * GIB)

    def host_text(self) -> str:
        """The host-memory figures, for a refusal or a note."""
        if self.host_bytes_per_node is None:
            return "host memory not estimated (model shape unknown)"
        ram = f" of the node's {self.host_memory_gib:g} GiB RAM" if self.host_memory_gib is not None else ""
        verdict = "" if self.host_fits else ": does not fit"
        return f"host memory {self.host_bytes_per_node / GIB:.1f} GiB on the busiest node{ram}{verdict}"

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def per_gpu_gib(self) -> float:
        return self.plan.per_rank_bytes.get("total", 0) / GIB

    @property
    def fits(self) -> bool:
        return self.plan.fits and self.batches is not None and self.host_fits


def largest_tensor_bytes(shape: ModelShape, load_bytes: int) -> int:
    """The largest single weight at `load_bytes` per element: an embedding (or LM head) or an MLP projection."""
    return max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate) * load_bytes


def host_bytes_per_node(run: RunConfig, shape: ModelShape, strategy: str, gpus_per_node: int) -> int:
    """Host memory of the busiest node while the base loads (see the module docstring)."""
    inputs = inputs_from_run(run)
    load_bytes = 4 if inputs.method == "full" else DTYPE_BYTES[inputs.dtype]
    in_flight = largest_tensor_bytes(shape, load_bytes)
    if strategy in ("fsdp", "hsdp") and inputs.method != "qlora":
        return shape.params * load_bytes + (gpus_per_node - 1) * in_flight
    return gpus_per_node * in_flight


def _at(run: RunConfig, shape: ModelShape | None, hardware: Hardware, nodes: int, batching: Batching | None,
        configured: str | None, offload: bool = False) -> Placement:
    plan = decide_parallelism(run, shape, hardware.gpu_memory_gib, nodes * hardware.gpus_per_node, configured,
                              offload, hardware.gpus_per_node)
    batches, why_not = None, None
    try:
        batches = plan_batches(run, shape, hardware.gpu_memory_gib, batching, plan.shards, offload)
    except DoesNotFit as exc:
        why_not = str(exc)
    host = None
    if shape is not None:
        host = host_bytes_per_node(run, shape, plan.strategy, hardware.gpus_per_node)
        host += hardware.gpus_per_node * plan.per_rank_bytes.get("offloaded_to_host", 0)
    return Placement(nodes=nodes, gpus_per_node=hardware.gpus_per_node, plan=plan, batches=batches, why_not=why_not,
                     needs_sharding=configured is not None and plan.strategy == "fsdp", host_bytes_per_node=host,
                     host_memory_gib=hardware.host_memory_gib)


def hsdp_nodes(run: RunConfig, hardware: Hardware) -> int:
    """The node counts a configured `train.hsdp_shard_size` allows are the multiples of this (1 otherwise)."""
    train = run.train
    if train is None or train.parallelism != "hsdp" or train.hsdp_shard_size is None:
        return 1
    return train.hsdp_shard_size // math.gcd(train.hsdp_shard_size, hardware.gpus_per_node)


def decide_placement(run: RunConfig, shape: ModelShape | None, hardware: Hardware, nodes: int | None = None,
                     batching: Batching | None = None) -> Placement | None:
    """The run's placement over `nodes` nodes of `hardware`, or (`nodes` None) over the fewest whole nodes on which
    it fits: one when a replica fits, else as many as the fewest FSDP ranks need; None when no node count fits (the
    activations alone are over). `batching` is the resolved batching (default: what the config plans with)."""
    offload = run.train is not None and run.train.offload == "params"
    if nodes is not None:
        placed = _at(run, shape, hardware, nodes, batching, None, offload)
        train = run.train
        if placed.fits or offload or train is None or train.offload == "none" or train.parallelism == "ddp":
            return placed
        offloaded = _at(run, shape, hardware, nodes, batching, None, True)  # auto: only when nothing else fits
        return offloaded if offloaded.fits else placed
    configured = "fsdp" if run.train is not None and run.train.parallelism == "ddp" else None
    step = hsdp_nodes(run, hardware)
    if step > 1:  # HSDP's memory is its shard group's, whatever the replicas: the fewest whole groups or nothing
        placed = _at(run, shape, hardware, step, batching, configured, offload)
        return placed if placed.fits else None
    one = _at(run, shape, hardware, 1, batching, configured, offload)
    if one.fits:
        return one
    ranks = one.plan.min_fsdp_ranks
    if ranks is None:
        return None
    found = _at(run, shape, hardware, math.ceil(ranks / hardware.gpus_per_node), batching, configured, offload)
    return found if found.fits else None


def offloaded_placement(run: RunConfig, shape: ModelShape, hardware: Hardware, nodes: int) -> Placement:
    """The run over `nodes` nodes with FSDP's CPU offload, whatever `train.offload` says (the comparison's offload
    rows: what a placement on fewer GPUs would need)."""
    return _at(run, shape, hardware, nodes, None, None, True)


SecondsPerToken = Callable[[Placement], "float | None"]
"""Wall seconds per training token of a whole run on a placement (None: not known, e.g. a fabric without a figure)."""


def choose_nodes(run: RunConfig, shape: ModelShape | None, hardware: Hardware, most_nodes: int,
                 seconds_per_token: SecondsPerToken, fewest_nodes: int = 1) -> Placement | None:
    """The placement over as many of `most_nodes` nodes as train fastest: from `fewest_nodes` up, each node count's
    `decide_placement` (offload under `auto` where nothing else fits there); a node count that fits replaces the one
    chosen so far only when `seconds_per_token` says it is faster (a tie or an unknown time keeps fewer nodes).
    None when no node count up to `most_nodes` fits."""
    chosen, chosen_time = None, None
    step = hsdp_nodes(run, hardware)
    for nodes in range(max(1, fewest_nodes), most_nodes + 1):
        if nodes % step:
            continue
        placed = decide_placement(run, shape, hardware, nodes)
        if not placed.fits:
            continue
        time = seconds_per_token(placed)
        if chosen is None or (time is not None and chosen_time is not None and time < chosen_time):
            chosen, chosen_time = placed, time
    return chosen
