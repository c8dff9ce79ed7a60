"""Fused LM head + cross-entropy for training (Liger's Triton kernel, CUDA): the (labelled tokens x vocab)
logits, their fp32 copy and gradient never exist; the loss is computed chunk by chunk.

`enable(model)` routes the causal LM's training loss at its labelled positions (workloads/train/label_loss.py)
through the kernel instead of the LM head.
"""

from __future__ import annotations

from typing import Any

import torch

from workloads.train import label_loss


def available() -> bool:
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def _liger_loss(model: Any, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    dtype = torch.bfloat16 if hidden.dtype == torch.float32 and torch.cuda.is_bf16_supported() else hidden.dtype
    return liger_fused_linear_cross_entropy(hidden.to(dtype), model.lm_head.weight.to(dtype), targets,
                                            reduction="sum")


def enable(model: Any) -> None:
    """Route `model`'s training loss through the fused kernel (raises when CUDA or liger-kernel is missing)."""
    if not available():
        raise RuntimeError("train.fused_loss needs a CUDA GPU and the liger-kernel package (pip install liger-kernel)")
    label_loss.enable(model, _liger_loss)
