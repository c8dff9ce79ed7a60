"""Perplexity on assistant tokens only, from the tokenized test split (labels -100 elsewhere, as in training)."""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from workloads.eval.metrics import perplexity

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
def assistant_perplexity(model, dataset, batch_size: int, pad_id: int, desc: str) -> tuple[float, int]:
    """Token-weighted perplexity over every label != -100 (next-token shift as in causal LM training)."""
    model.eval()
    device = next(model.parameters()).device
    total_nll, total_tokens = 0.0, 0
    for start in tqdm(range(0, len(dataset), batch_size), desc=desc, unit="batch"):
        rows = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        ids, mask, labels = _batch(rows, pad_id, device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = labels[:, 1:]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=-100, reduction="sum"
        )
        total_nll += nll.item()
        total_tokens += int((target != -100).sum())
    return perplexity(total_nll, total_tokens), total_tokens
