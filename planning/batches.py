"""Tokens per micro-batch and activation checkpointing, chosen from the memory estimate.

The configured global batch, `micro_batch_size x gradient_accumulation_steps x max_length` tokens per GPU and
optimizer step, is kept: `micro_batch_tokens: auto` splits it into the fewest equal packed micro-batches whose
estimated peak fits `memory_fraction` of the GPU (gradient accumulation makes up the rest).
`gradient_checkpointing: auto` trains without recomputation when that still allows micro-batches of at least
`EFFICIENT_TOKENS` tokens (or the whole step), and with it otherwise. The trainer and the preview's model-fits
policy both call `plan_batches`, so they agree on the numbers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from documents.train_plan import Batching, BatchPlan, planned_batching
from planning.memory import GIB, MemoryInputs, estimate, inputs_from_run
from planning.model_shapes import ModelShape

if TYPE_CHECKING:
    from documents.run_config import RunConfig
    from documents.sections.train import TrainConfig

EFFICIENT_TOKENS = 2048
"""Smallest micro-batch worth trading recomputation for. Recomputation runs every forward twice: with a frozen
base, 6N instead of 4N FLOPs per token, +50 %. Smaller micro-batches cost little by comparison. A GEMM of
2,048 rows against a 5,120 x 17,408 weight does about 1,350 FLOPs per byte it moves, over 4x an H100's
bf16 ridge point (989 TFLOP/s over 3.35 TB/s, about 300), so it is still compute-bound. A 4-bit base is
dequantized twice per micro-batch (forward and backward, 2.5 bytes per weight each time). For Qwen3-14B
that is about 25 ms against about 170 ms of GEMMs at 2,048 tokens (4N FLOPs per token at 700 TFLOP/s)."""
ALIGN = 64


def tokens_per_step(train: TrainConfig, max_length: int, batching: Batching, ranks: int = 1,
                    tokens_per_row: float | None = None) -> float:
    """Tokens one optimizer step takes in over `ranks` data-parallel ranks: accumulation x ranks x a micro-batch
    (packed: micro_batch_size x max_length tokens; padded: micro_batch_size rows of `tokens_per_row` tokens, at
    most max_length when the rows are not known). The batch plan and the cost model both count with it."""
    row = max_length if batching == "packed" or tokens_per_row is None else tokens_per_row
    return train.gradient_accumulation_steps * max(ranks, 1) * train.micro_batch_size * row


class DoesNotFit(ValueError):
    """Not even one sequence per micro-batch fits the memory budget."""


def _sized(inputs: MemoryInputs, tokens: int, checkpointing: bool) -> MemoryInputs:
    return inputs.model_copy(update={"micro_batch": 1, "max_length": tokens, "gradient_checkpointing": checkpointing})


def _largest_split(shape: ModelShape, inputs: MemoryInputs, step_tokens: int, max_length: int, budget: float,
                   checkpointing: bool) -> tuple[int, int] | None:
    """(tokens, accumulation) for the fewest equal micro-batches of >= max_length tokens that fit `budget` bytes."""
    for steps in range(1, max(1, step_tokens // max_length) + 1):
        tokens = max(max_length, ALIGN * math.ceil(step_tokens / steps / ALIGN))
        if estimate(shape, _sized(inputs, tokens, checkpointing)).total <= budget:
            return tokens, steps
    return None


def plan_batches(run: RunConfig, shape: ModelShape | None, gpu_memory_gib: float | None,
                 batching: Batching | None = None, shards: int = 1, offload: bool = False) -> BatchPlan:
    """The micro-batch size, accumulation and checkpointing a run trains with on a GPU of `gpu_memory_gib`
    (None: no GPU, the configured sizes are used and `auto` checkpointing is off). `batching` is the resolved
    choice (default: what the configured one plans with before the data is read); padded (`grouped`)
    micro-batches keep the configured micro_batch_size rows and ignore `micro_batch_tokens`. `shards` is the
    parallelism plan's (FSDP ranks; 1 under DDP), `offload` its CPU offload."""
    train = run.train
    packed = (batching or planned_batching(train.batching)) == "packed"
    inputs = inputs_from_run(run, batching, shards, offload)
    length = inputs.max_length
    accumulation = train.gradient_accumulation_steps
    step_tokens = int(tokens_per_step(train, length, "packed"))
    fraction = train.memory_fraction
    configured = train.micro_batch_tokens if packed else None
    auto_tokens = configured == "auto"
    auto_ckpt = train.gradient_checkpointing == "auto"
    if gpu_memory_gib is None or shape is None or not (auto_tokens or auto_ckpt):
        tokens = configured if isinstance(configured, int) else inputs.micro_batch * length
        checkpointing = inputs.gradient_checkpointing if not auto_ckpt else gpu_memory_gib is not None
        steps = max(1, round(step_tokens / tokens)) if isinstance(configured, int) else accumulation
        plan = BatchPlan(micro_batch_tokens=tokens, gradient_accumulation_steps=steps,
                         gradient_checkpointing=checkpointing, step_tokens=step_tokens, estimate_gib=None,
                         gpu_memory_gib=gpu_memory_gib, memory_fraction=fraction, source="config")
        if shape is None:
            return plan
        need = estimate(shape, plan_inputs(run, plan, batching, shards, offload)).total_gib
        return plan.model_copy(update={"estimate_gib": round(need, 2)})
    budget = fraction * gpu_memory_gib * GIB
    fixed = None if auto_tokens else int(configured or inputs.micro_batch * length)
    options = [False, True] if auto_ckpt else [inputs.gradient_checkpointing]
    chosen: tuple[int, int, bool] | None = None
    for checkpointing in options:
        if fixed is not None:
            fits = estimate(shape, _sized(inputs, fixed, checkpointing)).total <= budget
            found = (fixed, max(1, round(step_tokens / fixed))) if fits else None
        else:
            found = _largest_split(shape, inputs, step_tokens, length, budget, checkpointing)
        if found is None:
            continue
        tokens, steps = found
        last = checkpointing == options[-1]
        if last or fixed is not None or tokens >= min(step_tokens, EFFICIENT_TOKENS):
            chosen = (tokens, steps, checkpointing)
            break
    if chosen is None:
        raise DoesNotFit(
            f"train: not even one {length}-token sequence per micro-batch fits {fraction:.0%} of "
            f"{gpu_memory_gib} GiB (estimate {estimate(shape, _sized(inputs, length, True)).total_gib:.1f} GiB "
            "with activation checkpointing)")
    tokens, steps, checkpointing = chosen
    need = estimate(shape, _sized(inputs, tokens, checkpointing)).total_gib
    return BatchPlan(micro_batch_tokens=tokens, gradient_accumulation_steps=steps, gradient_checkpointing=checkpointing,
                     step_tokens=step_tokens, estimate_gib=round(need, 2), gpu_memory_gib=gpu_memory_gib,
                     memory_fraction=fraction, source="auto")


def plan_inputs(run: RunConfig, plan: BatchPlan, batching: Batching | None = None, shards: int = 1,
                offload: bool = False) -> MemoryInputs:
    """The memory-estimate inputs of a planned run (what the preview's model-fits policy checks): one packed row
    of the planned tokens, or the configured micro-batch of sequences when the sizes come from the config."""
    packed = (batching or planned_batching(run.train.batching)) == "packed"
    inputs = inputs_from_run(run, batching, shards, offload).model_copy(
        update={"gradient_checkpointing": plan.gradient_checkpointing})
    if plan.source == "config" and (run.train.micro_batch_tokens is None or not packed):
        return inputs
    return _sized(inputs, plan.micro_batch_tokens, plan.gradient_checkpointing)
