"""Static-shape packed micro-batches, and (on CUDA) varlen flash attention and the fused loss against references.

The CUDA tests build their own tiny random Qwen3 model and use no fixture, so on a GPU machine they run with
`python -m pytest --noconftest tests/test_train_attention.py`; without a GPU they are skipped.
"""

from __future__ import annotations

import pytest
import torch

from workloads.train import attention
from workloads.train.batching import IGNORE_INDEX, REAL_TOKENS, PackedCollator, batch_tokens

CUDA = torch.cuda.is_available()


def _pack(lengths: list[int], seed: int = 0) -> dict[str, list[dict[str, list[int]]]]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(5, 200, (n,), generator=gen).tolist()
        rows.append({"input_ids": ids, "labels": [IGNORE_INDEX] * (n // 2) + ids[n // 2:]})
    return {"pack": rows}


def test_packed_micro_batches_have_one_fixed_length() -> None:
    collate = PackedCollator(token_budget=64, pad_id=3)
    for lengths in ([10, 20, 5], [64], [1, 1, 1, 30]):
        batch = collate([_pack(lengths)])
        real = sum(lengths)
        assert batch["input_ids"].shape == (1, 64)
        assert batch_tokens(batch) == (real, 64)
        assert batch[REAL_TOKENS] == real
        assert (batch["input_ids"][0, real:] == 3).all()
        assert (batch["labels"][0, real:] == IGNORE_INDEX).all()
        bounds = [0]
        for n in lengths:
            bounds.append(bounds[-1] + n)
        if real < 64:
            bounds.append(64)
        assert batch["cu_seq_lens_q"].tolist() == bounds
        assert batch["max_length_q"] == max(b - a for a, b in zip(bounds, bounds[1:]))
        assert all(batch["position_ids"][0, start] == 0 for start in bounds[:-1])


def test_a_pack_over_the_budget_is_an_error() -> None:
    with pytest.raises(ValueError, match="exceeds the budget of 16"):
        PackedCollator(token_budget=16)([_pack([10, 10])])


def test_attention_choice() -> None:
    assert attention.choose(cuda=False, packed=True) == attention.AttentionChoice(implementation="sdpa",
                                                                                  backend="default")
    assert attention.choose(cuda=True, packed=False).backend == "default"
    packed = attention.choose(cuda=True, packed=True)
    assert packed.implementation == (attention.VARLEN if attention.varlen_available() else "sdpa")


def _tiny_qwen3(implementation: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=512)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation=implementation).cuda()


@pytest.mark.skipif(not CUDA or not attention.varlen_available(), reason="needs CUDA and torch varlen attention")
def test_varlen_flash_packed_logits_equal_per_sequence_logits() -> None:
    attention.register()
    model = _tiny_qwen3(attention.VARLEN).eval()
    lengths = [37, 100, 5, 60]
    batch = PackedCollator(token_budget=256)([_pack(lengths)])
    inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items() if k != REAL_TOKENS}
    with torch.no_grad():
        packed = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"],
                       cu_seq_lens_q=inputs["cu_seq_lens_q"], cu_seq_lens_k=inputs["cu_seq_lens_k"],
                       max_length_q=inputs["max_length_q"], max_length_k=inputs["max_length_k"]).logits.float()
        reference = _tiny_qwen3("sdpa").eval()
        offset = 0
        for n in lengths:
            ids = inputs["input_ids"][:, offset:offset + n]
            alone = reference(input_ids=ids).logits.float()
            error = (packed[:, offset:offset + n] - alone).norm() / alone.norm()
            assert error < 2e-2, f"sequence of {n} tokens: relative error {error:.2e}"
            offset += n


@pytest.mark.skipif(not CUDA, reason="needs CUDA and liger-kernel")
def test_fused_loss_equals_the_standard_loss_and_gradients() -> None:
    from workloads.train import fused_loss

    if not fused_loss.available():
        pytest.skip("liger-kernel is not installed")
    batch = PackedCollator(token_budget=192)([_pack([50, 90, 30], seed=1)])
    inputs = {k: v.cuda() for k, v in batch.items() if k in ("input_ids", "position_ids", "labels")}
    results = []
    for fused in (False, True):
        model = _tiny_qwen3("sdpa").train()
        if fused:
            fused_loss.enable(model)
        count = int((inputs["labels"][:, 1:] != IGNORE_INDEX).sum())
        loss = model(**inputs, num_items_in_batch=count).loss
        loss.backward()
        results.append((loss.float().item(), model.model.layers[0].mlp.down_proj.weight.grad.float().clone()))
    (plain, plain_grad), (fused_value, fused_grad) = results
    assert fused_value == pytest.approx(plain, rel=2e-2)
    assert (fused_grad - plain_grad).norm() / plain_grad.norm() < 5e-2
