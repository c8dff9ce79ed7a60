"""The training loss with the LM head run at labelled positions only.

With assistant-only labels most positions of a row are context whose prediction is never scored (the local
finance QA rows: about 7 labelled tokens in 372), yet the causal LM's own loss computes (tokens x vocab) logits
for every position, then their fp32 copy and gradient. `enable(model)` replaces the causal LM's `forward` on that
instance: in training with labels it runs the decoder, keeps the hidden states whose next-token target is
labelled (the same shift and ignore index as transformers' causal LM loss), and computes the loss on those rows
alone; summed and divided by the Trainer's `num_items_in_batch` (so gradient accumulation weighs every token
equally), else by the labelled-token count. The value and gradients are the standard loss's; only the work
differs. Otherwise (evaluation, no labels) the original forward runs.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import CausalLMOutputWithPast

from workloads.train.batching import IGNORE_INDEX

HeadLoss = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]
"""(causal LM, hidden states of the labelled positions (n x hidden), their targets (n)) -> the loss summed over
the n positions."""


def lm_head_loss(model: Any, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's own LM head over the given positions, in fp32, summed."""
    return F.cross_entropy(model.lm_head(hidden).float(), targets, reduction="sum")


def labelled(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states (n x hidden) of the positions whose next token is labelled, and those next tokens."""
    targets = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].to(hidden.device)
    scored = targets != IGNORE_INDEX
    return hidden[scored], targets[scored]


def enable(model: Any, head_loss: HeadLoss = lm_head_loss) -> None:
    """Route `model`'s training loss through `head_loss` at the labelled positions only."""
    original = model.forward

    def forward(self: Any, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                num_items_in_batch: torch.Tensor | int | None = None, **kwargs: Any) -> CausalLMOutputWithPast:
        if labels is None or not self.training:
            return original(input_ids=input_ids, labels=labels, num_items_in_batch=num_items_in_batch, **kwargs)
        hidden, targets = labelled(self.model(input_ids=input_ids, **kwargs).last_hidden_state, labels)
        total = head_loss(self, hidden, targets)
        count = num_items_in_batch if num_items_in_batch is not None else max(1, targets.numel())
        if isinstance(count, torch.Tensor):
            count = count.to(total.device)
        return CausalLMOutputWithPast(loss=total / count)

    model.forward = MethodType(forward, model)
