"""Fused LM head + cross-entropy for training (Liger's Triton kernel, CUDA): for a 151k-token vocabulary the
(tokens x vocab) logits, their fp32 copy and gradient never exist; the loss is computed chunk by chunk.

`enable(model)` replaces the causal LM's `forward` on that instance. In training with labels it returns only
the loss (summed over assistant tokens and divided by the Trainer's `num_items_in_batch`, so gradient
accumulation weighs every token equally, as the unfused loss does); otherwise it runs the original forward.
"""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import CausalLMOutputWithPast

IGNORE_INDEX = -100


def available() -> bool:
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def enable(model: Any) -> None:
    """Route `model`'s training loss through the fused kernel (raises when CUDA or liger-kernel is missing)."""
    if not available():
        raise RuntimeError("train.fused_loss needs a CUDA GPU and the liger-kernel package (pip install liger-kernel)")
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    original = model.forward

    def forward(self: Any, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                num_items_in_batch: torch.Tensor | int | None = None, **kwargs: Any) -> CausalLMOutputWithPast:
        if labels is None or not self.training:
            return original(input_ids=input_ids, labels=labels, num_items_in_batch=num_items_in_batch, **kwargs)
        hidden = self.model(input_ids=input_ids, **kwargs).last_hidden_state
        dtype = torch.bfloat16 if hidden.dtype == torch.float32 and torch.cuda.is_bf16_supported() else hidden.dtype
        weight = self.lm_head.weight.to(dtype)
        targets = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].reshape(-1).to(hidden.device)
        flat = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
        if num_items_in_batch is None:
            loss = liger_fused_linear_cross_entropy(flat, weight, targets, ignore_index=IGNORE_INDEX)
        else:
            loss = liger_fused_linear_cross_entropy(flat, weight, targets, ignore_index=IGNORE_INDEX,
                                                    reduction="sum") / num_items_in_batch
        return CausalLMOutputWithPast(loss=loss)

    model.forward = MethodType(forward, model)
