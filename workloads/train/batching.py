"""Batches without compute spent on padding.

`packed`: sequences are bin-packed into micro-batches of at most `token_budget` tokens, concatenated into one
row with position ids restarting at 0 for each sequence, and filled up to exactly `token_budget` tokens with
one filler sequence (pad tokens, no loss), so every micro-batch of a run has the same shape and kernels are
planned once. The row carries the sequence boundaries (`cu_seq_lens_q`); on CUDA varlen flash attention uses
them, on CPU transformers turns the restarting position ids into a block-diagonal causal mask. Either way no
token attends across a boundary, and the first label of every sequence is masked so no token is trained to
predict the next sequence.
`grouped`: similar lengths share a micro-batch and are padded to the longest of that batch only.
Which of the two a run uses (`auto`): workloads/train/batch_choice.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening

from workloads.train.batch_choice import pack_bins

IGNORE_INDEX = -100
COLUMNS = ("input_ids", "labels")
REAL_TOKENS = "real_tokens"


class PackedDataset(Dataset):
    """One item per bin: the tokenized rows (cut to `max_length`) that form one packed micro-batch."""

    def __init__(self, rows: Any, token_budget: int, max_length: int, seed: int) -> None:
        self.rows = rows.select_columns(list(COLUMNS))
        self.max_length = max_length
        self.bins = pack_bins([min(int(n), max_length) for n in rows["length"]], token_budget, seed)

    def __len__(self) -> int:
        return len(self.bins)

    def __getitem__(self, index: int) -> dict[str, list[dict[str, list[int]]]]:
        rows = (self.rows[i] for i in self.bins[index])
        return {"pack": [{c: row[c][: self.max_length] for c in COLUMNS} for row in rows]}


class PackedCollator:
    """Flattens the rows of the given packs into a single row (input_ids, labels, position_ids, sequence
    boundaries), filled to `token_budget` tokens when given; `real_tokens` counts the tokens that are not filler."""

    def __init__(self, token_budget: int | None = None, pad_id: int = 0) -> None:
        self.token_budget = token_budget
        self.pad_id = pad_id
        self._flatten = DataCollatorWithFlattening(separator_id=IGNORE_INDEX, return_flash_attn_kwargs=True)

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        rows = [row for item in items for row in item["pack"]]
        real = sum(len(row["input_ids"]) for row in rows)
        if self.token_budget is not None:
            if real > self.token_budget:
                raise ValueError(f"packed micro-batch of {real} tokens exceeds the budget of {self.token_budget}")
            if real < self.token_budget:
                fill = self.token_budget - real
                rows.append({"input_ids": [self.pad_id] * fill, "labels": [IGNORE_INDEX] * fill})
        return {**self._flatten(rows), REAL_TOKENS: real}


@dataclass
class PaddedCollator:
    """Pads each micro-batch to its longest row (or to `pad_to`), labels with -100."""

    tokenizer: Any
    pad_to: int | None = None

    def __post_init__(self) -> None:
        self._pad = DataCollatorForSeq2Seq(
            self.tokenizer,
            padding="max_length" if self.pad_to else "longest",
            max_length=self.pad_to,
            label_pad_token_id=IGNORE_INDEX,
            return_tensors="pt",
        )

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self._pad([{c: row[c] for c in ("input_ids", "attention_mask", "labels")} for row in rows])


def batch_tokens(batch: dict[str, Any]) -> tuple[int, int]:
    """(real tokens, processed tokens) of a collated micro-batch."""
    processed = batch["input_ids"].numel()
    if REAL_TOKENS in batch:
        return int(batch[REAL_TOKENS]), processed
    mask = batch.get("attention_mask")
    return (int(mask.sum()) if mask is not None else processed), processed
