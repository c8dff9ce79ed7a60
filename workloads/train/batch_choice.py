"""Packed or padded (`grouped`) micro-batches: the one pure choice the trainer, the memory estimate, the batch
plan and the cost report all make through `decide_batching` (no torch at import: the preview side uses it).

Under `train.batching: auto` the cost per real token of each is predicted from the rows' lengths:
(micro-batch overhead + tokens processed) / real tokens, summed over the micro-batches each would form. Packed
micro-batches hold exactly the token budget (bins from `pack_bins`, filler counted as processed); padded ones
are the Trainer's length-grouped micro-batches, each padded to its longest row. Rows already near `max_length`
(little padding, nothing to pack beside them) go padded; mixed lengths go packed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from documents.train_plan import Batching, BatchingDecision, Configured

MICRO_BATCH_OVERHEAD_TOKENS = 64
"""Cost of one micro-batch that does not grow with its tokens (4-bit dequantization of every weight, per-op
dispatch), in tokens' worth of compute: about 10 % of a 384-token SmolLM2-135M step in the CPU profile
(docs/training.md, "Packed or padded")."""
PACKED_ROW_PENALTY = {"cpu": 0.3, "cuda": 0.0}
"""Extra cost per packed token: on CPU attention runs over the whole row under a block-diagonal mask. Fitted to
bench/train.py on CPU (2026-11-25, SmolLM2-135M, 2 threads; docs/training.md): with a micro-batch costing 64 tokens'
worth plus its tokens (the grouped arm on both data sets), a 384-token packed micro-batch took 1.15x its tokens'
worth when it held one row plus filler and 1.31x when it held several rows (the mixed set). On CUDA varlen
attention computes only the diagonal blocks."""


def pack_bins(lengths: Sequence[int], token_budget: int, seed: int) -> list[list[int]]:
    """Row indices grouped into bins of at most `token_budget` tokens: a seeded shuffle, then first-fit over a
    small window of open bins (keeps bins full without sorting the data by length)."""
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    bins: list[list[int]] = []
    room: list[int] = []
    window = 8
    for index in order:
        size = min(lengths[index], token_budget)
        start = max(0, len(bins) - window)
        target = next((b for b in range(start, len(bins)) if room[b] >= size), None)
        if target is None:
            bins.append([])
            room.append(token_budget)
            target = len(bins) - 1
        bins[target].append(index)
        room[target] -= size
    return bins


def padded_batches(lengths: Sequence[int], micro_batch_size: int, group: int, seed: int) -> list[list[int]]:
    """Row lengths of the padded micro-batches the Trainer's length-grouped sampler forms (it sorts within
    mega-batches of `group` rows, a seeded permutation first)."""
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    order = get_length_grouped_indices(list(lengths), group, generator=torch.Generator().manual_seed(seed))
    return [[lengths[i] for i in order[k: k + micro_batch_size]] for k in range(0, len(order), micro_batch_size)]


def decide_batching(configured: Configured, lengths: Sequence[int] | None, *, micro_batch_size: int,
                    accumulation: int, max_length: int, token_budget: int, seed: int, cuda: bool,
                    ) -> BatchingDecision:
    """The configured batching, or under `auto` the one with the lower predicted cost per real token for these
    row lengths (cut to `max_length`); packed micro-batches hold `token_budget` tokens. Without lengths `auto`
    plans as packed (its micro-batch is always the full budget: the bound for memory and cost previews).
    Deterministic given its arguments, so every DDP rank decides the same."""
    if configured != "auto":
        return BatchingDecision(configured=configured, chosen=configured, reason="configured")
    if not lengths:
        return BatchingDecision(configured="auto", chosen="packed", reason="no data lengths: planned as packed")
    device: Literal["cpu", "cuda"] = "cuda" if cuda else "cpu"
    cut = [min(int(n), max_length) for n in lengths]
    real = sum(cut)
    bins = pack_bins(cut, token_budget, seed)
    fill = real / (len(bins) * token_budget)
    penalty = PACKED_ROW_PENALTY[device]
    overhead = MICRO_BATCH_OVERHEAD_TOKENS
    packed_cost = len(bins) * (overhead + token_budget * (1 + penalty)) / real
    batches = padded_batches(cut, micro_batch_size, micro_batch_size * accumulation, seed)
    padded = sum(len(b) * max(b) for b in batches)
    padded_cost = (overhead * len(batches) + padded) / real
    chosen: Batching = "packed" if packed_cost < padded_cost else "grouped"
    return BatchingDecision(
        configured="auto", chosen=chosen, device=device, rows=len(cut), token_budget=token_budget,
        packed_fill=round(fill, 4), padded_efficiency=round(real / padded, 4), packed_cost=round(packed_cost, 4),
        padded_cost=round(padded_cost, 4), overhead_tokens=overhead, packed_penalty=penalty,
        reason=f"auto: predicted cost per real token, packed {packed_cost:.3f} (fill {fill:.3f} of {token_budget} "
               f"tokens) vs grouped {padded_cost:.3f} (padding efficiency {real / padded:.3f} at {micro_batch_size} "
               "rows per micro-batch)",
    )
