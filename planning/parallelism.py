"""DDP, FSDP or HSDP: the one pure choice the trainer, the memory estimate, the cost model and the preview's model-fits
policy make through `decide_parallelism` (no torch at import: the preview side uses it).

Under `train.parallelism: auto` a run keeps DDP (one whole replica per GPU: the cheapest in communication) while
that replica's estimated peak (planning.memory: weights, adapter, gradients, optimizer states, activations
at the planned micro-batch) fits `memory_fraction` of the GPU, and otherwise shards with FSDP full shard by decoder
layer over all `world_size` ranks: weights, trainable parameters, gradients and Adam states divided by the ranks,
activations not. Without a known GPU memory (CPU) `auto` is DDP. `auto` never chooses HSDP; `train.parallelism:
hsdp` shards within groups of `train.hsdp_shard_size` ranks (default one node's) and replicates across the groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from documents.train_plan import ParallelismPlan
from planning.memory import GIB, MemoryEstimate, MemoryInputs, estimate, inputs_from_run, require_train
from planning.model_shapes import ModelShape

if TYPE_CHECKING:
    from documents.run_config import RunConfig

MAX_RANKS = 4096
"""Largest rank count `min_fsdp_ranks` searches."""


def fit_inputs(run: RunConfig, offload: bool = False) -> MemoryInputs:
    """The memory-estimate inputs the fit is judged on: the configured micro-batch, or one `max_length` sequence
    when `micro_batch_tokens: auto` (the smallest micro-batch sizing may choose), with activation checkpointing
    when it is `auto` (sizing turns it on when needed to fit)."""
    train = require_train(run)
    inputs = inputs_from_run(run, offload=offload)
    update: dict[str, object] = {}
    if train.micro_batch_tokens == "auto":
        update["micro_batch"] = 1
    elif isinstance(train.micro_batch_tokens, int):
        update.update(micro_batch=1, max_length=train.micro_batch_tokens)
    if train.gradient_checkpointing == "auto":
        update["gradient_checkpointing"] = True
    return inputs.model_copy(update=update)


def per_rank_parts(need: MemoryEstimate, method: str) -> dict[str, int]:
    """The estimate's bytes by the parts the run manifest and the preview show."""
    full = method == "full"
    parts = {
        "base_weights": 0 if full else need.weights,
        "trainable_weights": need.weights if full else need.lora,
        "gradients": need.gradients,
        "optimizer_states": need.optimizer,
        "gathered_weights": need.gathered,
        "activations": need.activations + max(need.recompute, need.logits),
        "overhead": need.overhead,
    }
    if need.offloaded:
        parts["offloaded_to_host"] = need.offloaded
    return parts | {"total": need.total}


def _min_fsdp_ranks(shape: ModelShape, inputs: MemoryInputs, budget: float) -> int | None:
    """Fewest ranks whose FSDP estimate fits `budget` (the estimate falls monotonically with the ranks)."""
    def fits(n: int) -> bool:
        return estimate(shape, inputs.model_copy(update={"shards": n})).total <= budget

    if not fits(MAX_RANKS):
        return None
    low, high = 1, MAX_RANKS
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle + 1, high)
    return low


class BadShardSize(ValueError):
    """`train.hsdp_shard_size` (or the ranks per node) does not divide the world size."""


def hsdp_shard_size(configured: int | None, world_size: int, ranks_per_node: int | None) -> int:
    """Ranks per HSDP shard group: `train.hsdp_shard_size`, else the ranks of one node (else every rank); it must
    divide `world_size`."""
    shard = configured or ranks_per_node or world_size
    if world_size % shard:
        raise BadShardSize(f"train.hsdp_shard_size {shard}{'' if configured else ' (the ranks per node)'} does not "
                         f"divide the world size of {world_size} ranks: HSDP needs whole replicas of {shard} shards")
    return shard


def decide_parallelism(run: RunConfig, shape: ModelShape | None, gpu_memory_gib: float | None,
                       world_size: int, configured: str | None = None, offload: bool = False,
                       ranks_per_node: int | None = None) -> ParallelismPlan:
    """The configured parallelism, or under `auto` DDP while one replica fits `memory_fraction` of
    `gpu_memory_gib` and FSDP over `world_size` ranks otherwise (see the module docstring). `shape` None (an
    unknown model) or `gpu_memory_gib` None (CPU) leave the configured choice, or DDP, unchecked. Deterministic
    given its arguments, so every rank decides the same. `configured` decides as if the run said so (the placement
    search asks what a run forcing DDP would need sharded; the run config is never rewritten). `offload` keeps the
    shards in host memory (FSDP's CPU offload; it implies FSDP, or HSDP where configured). Under `hsdp` the shards
    are groups of `train.hsdp_shard_size` ranks (default `ranks_per_node`; see `hsdp_shard_size`) and each rank's
    memory is FSDP's over its group; a group of one rank is DDP, one group of every rank FSDP."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    train = require_train(run)
    configured, fraction = configured or train.parallelism, train.memory_fraction
    common = {"configured": configured, "method": train.method, "world_size": world_size,
              "gpu_memory_gib": gpu_memory_gib, "memory_fraction": fraction,
              "offload": "params" if offload else "none"}
    if offload and configured != "hsdp":
        configured = "fsdp"
    group = hsdp_shard_size(train.hsdp_shard_size, world_size, ranks_per_node) if configured == "hsdp" else 0

    def plan(strategy: str, reason: str, parts: dict[str, int], fits: bool, **more: object) -> ParallelismPlan:
        shards = {"fsdp": world_size, "hsdp": group}.get(strategy, 1)
        return ParallelismPlan(strategy=strategy, reason=reason, shards=shards, replicas=world_size // shards,
                               per_rank_bytes=parts, fits=fits, **common, **more)

    inputs = fit_inputs(run, offload)
    if configured == "hsdp":
        return _hsdp(plan, shape, inputs, gpu_memory_gib, fraction, train.method, world_size, group)
    if configured == "fsdp" and world_size == 1 and not offload:
        parts = per_rank_parts(estimate(shape, inputs), train.method) if shape is not None else {}
        budget = fraction * gpu_memory_gib * GIB if gpu_memory_gib is not None else None
        fits = budget is None or not parts or parts["total"] <= budget
        return plan("ddp", "fsdp: one rank, nothing to shard: the whole replica stays on its device", parts, fits)
    if shape is None:
        strategy = "ddp" if configured == "auto" else configured
        return plan(strategy, f"{configured}: model shape unknown, memory not estimated", {}, True)
    replica = estimate(shape, inputs)
    sharded = estimate(shape, inputs.model_copy(update={"shards": world_size}))
    if gpu_memory_gib is None:
        strategy = "ddp" if configured == "auto" else configured
        chosen = sharded if strategy == "fsdp" else replica
        return plan(strategy, f"{configured}: no GPU memory known (CPU): {strategy}, nothing to fit",
                    per_rank_parts(chosen, train.method), True, replica_bytes=replica.total)
    return _ddp_or_fsdp(plan, configured, shape, inputs, replica, sharded, fraction * gpu_memory_gib * GIB,
                        f"{fraction:.0%} of {gpu_memory_gib:g} GiB", train.method, world_size)


def _ddp_or_fsdp(plan: Callable[..., ParallelismPlan], configured: str, shape: ModelShape, inputs: MemoryInputs,
                 replica: MemoryEstimate, sharded: MemoryEstimate, budget: float, share: str, method: str,
                 world_size: int) -> ParallelismPlan:
    """On a GPU of known memory: DDP where configured or (auto) where one replica fits `budget` bytes, else FSDP over
    `world_size` ranks; `share` names the budget in the reason."""
    least = _min_fsdp_ranks(shape, inputs, budget)
    limit = f"{share} = {budget / GIB:.1f} GiB"
    more = {"replica_bytes": replica.total, "min_fsdp_ranks": least}
    replica_fits = replica.total <= budget
    sharded_fits = sharded.total <= budget
    if configured == "ddp" or (configured == "auto" and (replica_fits or world_size == 1)):
        verdict = "fits" if replica_fits else "does not fit"
        reason = f"{configured}: one whole replica needs {replica.total_gib:.1f} GiB per GPU, {verdict} {limit}"
        if not replica_fits:
            reason += _sharding_hint(least, world_size)
        return plan("ddp", reason, per_rank_parts(replica, method), replica_fits, **more)
    verdict = "fits" if sharded_fits else "does not fit"
    why = ("configured" if configured == "fsdp"
           else f"auto: one whole replica needs {replica.total_gib:.1f} GiB per GPU, over {limit}")
    reason = f"{why}; FSDP over {world_size} ranks needs {sharded.total_gib:.1f} GiB per GPU, {verdict} {limit}"
    if not sharded_fits:
        reason += _sharding_hint(least, world_size)
    return plan("fsdp", reason, per_rank_parts(sharded, method), sharded_fits, **more)


def _hsdp(plan: Callable[..., ParallelismPlan], shape: ModelShape | None, inputs: MemoryInputs,
          gpu_memory_gib: float | None, fraction: float, method: str, world_size: int, group: int) -> ParallelismPlan:
    """The configured HSDP: FSDP's per-rank memory over a shard group of `group` ranks, `world_size // group`
    replicas; a group of one rank is DDP, a group of every rank FSDP."""
    strategy = {1: "ddp", world_size: "fsdp"}.get(group, "hsdp")
    layout = f"hsdp: {world_size // group} replica(s) of {group} shard(s)"
    if strategy != "hsdp":
        layout += f", that is {strategy}"
    if shape is None:
        return plan(strategy, f"{layout}; model shape unknown, memory not estimated", {}, True)
    replica = estimate(shape, inputs)
    sharded = estimate(shape, inputs.model_copy(update={"shards": group}))
    parts = per_rank_parts(sharded, method)
    if gpu_memory_gib is None:
        return plan(strategy, f"{layout}; no GPU memory known (CPU), nothing to fit", parts, True,
                    replica_bytes=replica.total)
    budget = fraction * gpu_memory_gib * GIB
    least = _min_fsdp_ranks(shape, inputs, budget)
    fits = sharded.total <= budget
    reason = (f"{layout} needs {sharded.total_gib:.1f} GiB per GPU, {'fits' if fits else 'does not fit'} "
              f"{fraction:.0%} of {gpu_memory_gib:g} GiB = {budget / GIB:.1f} GiB")
    if not fits:
        reason += _sharding_hint(least, world_size)
    return plan(strategy, reason, parts, fits, replica_bytes=replica.total, min_fsdp_ranks=least)


def _sharding_hint(least: int | None, world_size: int) -> str:
    if least is None:
        return "; sharding cannot fit it either (the activations alone are over): shorten micro-batches or sequences"
    if least <= world_size:
        return f"; FSDP over {least} or more ranks fits (train.parallelism: fsdp or auto)"
    return f"; FSDP needs at least {least} ranks of this GPU"
