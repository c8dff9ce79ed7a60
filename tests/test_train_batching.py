"""Packing and grouping: no cross-sequence attention, no padding, every row used once."""

from __future__ import annotations

import random

import pytest
import torch
from datasets import Dataset, load_from_disk
from transformers import AutoModelForCausalLM

from workloads.train.batching import IGNORE_INDEX, PackedCollator, PackedDataset, batch_tokens, pack_bins


def test_pack_bins_uses_every_row_once_within_budget() -> None:
    lengths = [random.Random(1).randint(5, 120) for _ in range(300)]
    bins = pack_bins(lengths, token_budget=256, seed=3)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(300))
    assert all(sum(lengths[i] for i in b) <= 256 for b in bins)
    fill = sum(lengths) / (256 * len(bins))
    assert fill > 0.9, f"bins only {fill:.0%} full"
    assert pack_bins(lengths, 256, seed=3) == bins
    assert pack_bins(lengths, 256, seed=4) != bins


def test_pack_bins_rejects_bad_budget() -> None:
    with pytest.raises(ValueError, match="token_budget"):
        pack_bins([3, 4], token_budget=0, seed=0)


def _rows(n: int, seed: int = 0) -> Dataset:
    gen = random.Random(seed)
    rows = []
    for _ in range(n):
        length = gen.randint(8, 40)
        ids = [gen.randint(3, 500) for _ in range(length)]
        prompt = gen.randint(2, length - 2)
        labels = [IGNORE_INDEX] * prompt + ids[prompt:]
        rows.append({"input_ids": ids, "attention_mask": [1] * length, "labels": labels, "length": length})
    return Dataset.from_list(rows)


def test_packed_collator_flattens_without_padding() -> None:
    data = PackedDataset(_rows(20), token_budget=128, max_length=64, seed=0)
    batch = PackedCollator()([data[0]])
    pack = data[0]["pack"]
    total = sum(len(r["input_ids"]) for r in pack)
    assert batch["input_ids"].shape == (1, total)
    assert batch_tokens(batch) == (total, total)
    starts = [0]
    for row in pack[:-1]:
        starts.append(starts[-1] + len(row["input_ids"]))
    assert all(batch["position_ids"][0, s] == 0 for s in starts)
    assert all(batch["labels"][0, s] == IGNORE_INDEX for s in starts)


def test_packed_loss_equals_per_sequence_losses(tiny_prepared) -> None:
    """Same token-mean loss whether the sequences run one by one or packed into one row."""
    model = AutoModelForCausalLM.from_pretrained(tiny_prepared.base_model_dir, dtype=torch.float32)
    model.config.use_cache = False
    model.eval()
    rows = load_from_disk(str(tiny_prepared.train_tokenized_dir)).select(range(6))
    packed = PackedCollator()([{"pack": [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows]}])
    with torch.no_grad():
        packed_logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits
        packed_loss = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"],
                            labels=packed["labels"]).loss
        total, count, offset = 0.0, 0, 0
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            labels = torch.tensor([row["labels"]])
            out = model(input_ids=ids, labels=labels)
            n = int((labels[0, 1:] != IGNORE_INDEX).sum())
            total += out.loss.item() * n
            count += n
            torch.testing.assert_close(packed_logits[:, offset : offset + ids.shape[1]], out.logits, atol=1e-4, rtol=1e-4)
            offset += ids.shape[1]
    assert count > 0
    assert packed_loss.item() == pytest.approx(total / count, rel=1e-5)


def test_packing_without_position_ids_would_leak(tiny_prepared) -> None:
    """Control: the same packed row without restarting positions gives different logits (the test above can fail)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_prepared.base_model_dir, dtype=torch.float32)
    model.config.use_cache = False
    rows = load_from_disk(str(tiny_prepared.train_tokenized_dir)).select(range(2))
    packed = PackedCollator()([{"pack": [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows]}])
    first = len(rows[0]["input_ids"])
    with torch.no_grad():
        blocked = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits
        leaking = model(input_ids=packed["input_ids"]).logits
    assert not torch.allclose(blocked[:, first:], leaking[:, first:], atol=1e-3)
