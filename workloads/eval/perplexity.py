"""Perplexity on assistant tokens only, from the tokenized test split (labels -100 elsewhere, as in training)."""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from workloads.eval.prefill import NllSum

COLUMNS = ("input_ids", "labels")


def load_tokenized(path: Path, rows: int | None):
    from datasets import load_from_disk

    if not path.exists():
        raise FileNotFoundError(f"{path}: tokenized test split not found (run the data stage first)")
    dataset = load_from_disk(str(path))
    missing = [c for c in COLUMNS if c not in dataset.column_names]
    if missing:
        raise ValueError(f"{path}: tokenized split lacks column(s) {missing}")
    if rows is not None:
        dataset = dataset.select(range(min(rows, len(dataset))))
    return dataset


def _batch(rows: list[dict], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n] = torch.tensor(row["input_ids"])
        mask[i, :n] = 1
        labels[i, :n] = torch.tensor(row["labels"])
    return ids.to(device), mask.to(device), labels.to(device)


@torch.no_grad()
def assistant_nll(model, dataset, batch_size: int, pad_id: int, desc: str, scores: NllSum | None = None) -> NllSum:
    """The summed negative log-likelihood of every label != -100 (next-token shift as in causal LM training),
    added to `scores`; the vocabulary's logits are computed at the scored positions only."""
    model.eval()
    scores = scores if scores is not None else NllSum()
    device = next(model.parameters()).device
    for start in tqdm(range(0, len(dataset), batch_size), desc=desc, unit="batch"):
        rows = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        ids, mask, labels = _batch(rows, pad_id, device)
        target = labels[:, 1:]
        keep = torch.nonzero((target != -100).any(0)).flatten()
        if keep.numel():
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits
            scores.add(logits, target[:, keep])
    return scores
