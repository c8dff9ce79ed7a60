"""What a training run decided before its first step, as the run manifest records it: the batching (packed or
length-grouped) and the figures behind it, the attention kernel, the per-GPU batch plan, and DDP, FSDP or HSDP with the
per-rank memory behind it. The decisions themselves are made in workloads/train (batch_choice, attention, sizing,
parallelism)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Batching = Literal["packed", "grouped"]
Configured = Literal["auto", "packed", "grouped"]


class BatchingDecision(BaseModel):
    """The batching a run trains with and the figures it was chosen from (the run manifest's `batching`).
    Costs are predicted processed-token equivalents per real token, micro-batch overhead included."""

    model_config = ConfigDict(frozen=True)

    configured: Configured
    chosen: Batching
    reason: str
    device: Literal["cpu", "cuda"] | None = None
    rows: int | None = None
    token_budget: int | None = None
    packed_fill: float | None = None
    """real tokens / tokens of the packed micro-batches (the rest is filler)."""
    padded_efficiency: float | None = None
    """real tokens / tokens of the length-grouped padded micro-batches."""
    packed_cost: float | None = None
    padded_cost: float | None = None
    overhead_tokens: int | None = None
    packed_penalty: float | None = None


Backend = Literal["flash", "default"]


class AttentionChoice(BaseModel):
    """The attention implementation handed to transformers and the kernel it runs (the manifest's `attention`)."""

    model_config = ConfigDict(frozen=True)

    implementation: str
    backend: Backend


class BatchPlan(BaseModel):
    """What a run trains with per GPU (the run manifest's `batch_plan`)."""

    model_config = ConfigDict(frozen=True)

    micro_batch_tokens: int
    gradient_accumulation_steps: int
    gradient_checkpointing: bool
    step_tokens: int
    estimate_gib: float | None
    gpu_memory_gib: float | None
    memory_fraction: float
    source: Literal["auto", "config"]


def planned_batching(configured: Configured) -> Batching:
    """The batching to plan with before the data is read (preview, cost report, memory estimate)."""
    if configured == "auto":
        return "packed"
    return configured


class ParallelismPlan(BaseModel):
    """How a run spreads over its ranks and the per-rank memory it was chosen from (the run manifest's
    `parallelism`; decided by planning.parallelism.decide_parallelism)."""

    model_config = ConfigDict(frozen=True)

    configured: Literal["auto", "ddp", "fsdp", "hsdp"]
    strategy: Literal["ddp", "fsdp", "hsdp"]
    reason: str
    method: Literal["qlora", "lora", "full"]
    world_size: int
    shards: int
    """ranks each sharded tensor is split over: world_size under fsdp, 1 under ddp, the shard group under hsdp."""
    replicas: int = 1
    """copies of the (sharded) model: world_size under ddp, 1 under fsdp, world_size / shards under hsdp."""
    per_rank_bytes: dict[str, int]
    """estimated peak of one rank by part: base_weights (frozen), trainable_weights (adapter, or the fp32 masters of
    a full fine-tune), gradients, optimizer_states, gathered_weights (unsharded in use), activations, overhead, total;
    empty when the model's shape is unknown."""
    replica_bytes: int | None = None
    """the DDP estimate: one whole replica."""
    gpu_memory_gib: float | None = None
    memory_fraction: float
    fits: bool
    """total <= memory_fraction x GPU memory (True where no GPU memory is known: nothing to check)."""
    min_fsdp_ranks: int | None = None
    """fewest ranks over which the FSDP estimate fits (None: no GPU memory known, or even sharding cannot fit)."""
    offload: Literal["none", "params"] = "none"
    """params: FSDP's CPU offload (the shards of weights, gradients and optimizer states in host memory)."""
