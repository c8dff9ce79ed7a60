"""The training loss at labelled positions only (workloads/train/label_loss.py) against transformers' own causal
LM loss: the same value and gradients, on a packed and on a padded micro-batch, with and without the Trainer's
`num_items_in_batch`, while the LM head sees only the labelled positions."""

from __future__ import annotations

import pytest
import torch

from workloads.train import label_loss
from workloads.train.batching import IGNORE_INDEX, REAL_TOKENS, PackedCollator


def _tiny_llama() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").train()


def _rows(lengths: list[int], answer: int) -> list[dict[str, list[int]]]:
    """Rows whose last `answer` tokens are labelled, the rest context (-100), as assistant-only labels are."""
    gen = torch.Generator().manual_seed(1)
    rows = []
    for n in lengths:
        ids = torch.randint(5, 500, (n,), generator=gen).tolist()
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX] * (n - answer) + ids[n - answer:]})
    return rows


def _packed() -> dict[str, torch.Tensor]:
    batch = PackedCollator(token_budget=160, pad_id=0)([{"pack": _rows([50, 70, 30], answer=4)}])
    return {k: v for k, v in batch.items() if k in ("input_ids", "position_ids", "labels")}


def _padded() -> dict[str, torch.Tensor]:
    rows = _rows([40, 64, 25], answer=6)
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE_INDEX)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n], mask[i, :n], labels[i, :n] = torch.tensor(row["input_ids"]), 1, torch.tensor(row["labels"])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _loss_and_grads(batch: dict[str, torch.Tensor], selective: bool,
                    items: int | None) -> tuple[float, dict[str, torch.Tensor], list[int]]:
    model = _tiny_llama()
    head_rows: list[int] = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: head_rows.append(args[0].reshape(-1, 64).shape[0]))
    if selective:
        label_loss.enable(model)
    extra = {} if items is None else {"num_items_in_batch": torch.tensor(items)}
    loss = model(**batch, **extra).loss
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, head_rows


@pytest.mark.parametrize("make_batch", [_packed, _padded], ids=["packed", "padded"])
@pytest.mark.parametrize("with_items", [False, True], ids=["mean", "num_items_in_batch"])
def test_the_labelled_positions_loss_is_the_causal_lm_loss_with_its_gradients(make_batch, with_items: bool) -> None:
    batch = make_batch()
    # The next-token targets transformers' causal LM loss scores: labels shifted left by one, -100 ignored.
    scored = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    items = scored + 3 if with_items else None  # a Trainer total over several micro-batches
    reference, reference_grads, reference_rows = _loss_and_grads(batch, selective=False, items=items)
    value, grads, rows = _loss_and_grads(batch, selective=True, items=items)

    assert reference_rows == [batch["input_ids"].numel()]
    assert rows == [scored]
    assert value == pytest.approx(reference, rel=1e-5)
    assert grads.keys() == reference_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, reference_grads[name], rtol=1e-4, atol=1e-6), name


def test_evaluation_and_unlabelled_calls_run_the_original_forward() -> None:
    model = _tiny_llama()
    label_loss.enable(model)
    batch = _packed()
    model.eval()
    with torch.no_grad():
        evaluated = model(**batch)
    assert evaluated.logits.shape == (*batch["input_ids"].shape, 512)
    model.train()
    unlabelled = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    assert unlabelled.loss is None and unlabelled.logits.shape[1] == batch["input_ids"].shape[1]


def test_the_packed_collator_labels_are_what_the_test_scores() -> None:
    batch = PackedCollator(token_budget=160, pad_id=0)([{"pack": _rows([50, 70, 30], answer=4)}])
    assert batch[REAL_TOKENS] == 150
    # Each sequence's last 4 tokens are labels; the first of them is predicted from the token before it.
    assert int((batch["labels"][:, 1:] != IGNORE_INDEX).sum()) == 12
