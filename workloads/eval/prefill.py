"""One forward over a batch of test rows for both of the evaluator's uses of them: their perplexity, and the
prefill their greedy replies start from.

The evaluator's prompts are the tokenized test rows up to their final answer, and the same rows are scored for
perplexity, so scoring them with one forward and prefilling them for generation with another computed every
prompt token twice. Here the left-padded prompts less their last token go through the model once (keeping the
logits at the scored positions only, and the cache); the last prompt token and the rest of each row (its answer)
follow on that cache, which scores the answers; the cache is then cut back to the prompts and `generate` starts
from it, computing only the last prompt token again (as it would have computed it in its own prefill).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

IGNORED = -100


@dataclass
class NllSum:
    """Negative log-likelihood summed over scored (label != -100) tokens, how many tokens that is, and which rows
    of the test split (by index) it covers."""

    nll: float = 0.0
    tokens: int = 0
    rows: set[int] = field(default_factory=set)

    def add(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """`logits[b, t]` predicting `targets[b, t]` (IGNORED where not scored)."""
        scored = targets != IGNORED
        if not bool(scored.any()):
            return
        self.nll += torch.nn.functional.cross_entropy(logits[scored].float(), targets[scored], reduction="sum").item()
        self.tokens += int(scored.sum())


def left_padded_labels(rows: list[dict[str, Any]], lengths: list[int], width: int) -> torch.Tensor:
    """Each row's labels over its first `lengths[i]` tokens, left-padded with IGNORED to `width`."""
    labels = torch.full((len(rows), width), IGNORED, dtype=torch.long)
    for i, (row, n) in enumerate(zip(rows, lengths)):
        labels[i, width - n:] = torch.tensor(row["labels"][:n], dtype=torch.long)
    return labels


def continuations(rows: list[dict[str, Any]], ids: torch.Tensor, lengths: list[int],
                  pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: its last prompt token then the rest of the row, right-padded; their mask; and the targets each
    position predicts (the next token's label, IGNORED past the row's end)."""
    rests = [row["input_ids"][n:] for row, n in zip(rows, lengths)]
    width = 1 + max(map(len, rests))
    tokens = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORED, dtype=torch.long)
    for i, (row, n, rest) in enumerate(zip(rows, lengths, rests)):
        tokens[i, : 1 + len(rest)] = torch.tensor([int(ids[i, -1])] + list(rest), dtype=torch.long)
        mask[i, : 1 + len(rest)] = 1
        targets[i, : len(rest)] = torch.tensor(row["labels"][n:], dtype=torch.long)
    return tokens, mask, targets


@torch.no_grad()
def prefill_and_score(model, ids: torch.Tensor, mask: torch.Tensor, rows: list[dict[str, Any]], pad: int,
                      scores: NllSum) -> Any:
    """The cache of the left-padded prompts `ids` less their last token, after scoring every labelled token of
    `rows` (the tokenized rows the prompts were cut from, in order) into `scores`."""
    device = ids.device
    width = ids.shape[1]
    lengths = [int(n) for n in mask.sum(-1).tolist()]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    labels = left_padded_labels(rows, lengths, width).to(device)
    keep = torch.nonzero((labels[:, 1:] != IGNORED).any(0)).flatten()
    out = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], use_cache=True,
                logits_to_keep=keep if keep.numel() else 1)
    if keep.numel():
        scores.add(out.logits, labels[:, 1:][:, keep])
    cache = out.cache
    tokens, tail_mask, targets = continuations(rows, ids, lengths, pad)
    tail_positions = positions[:, -1:] + torch.arange(tokens.shape[1], device=device)
    tail = model(input_ids=tokens.to(device), attention_mask=torch.cat([mask[:, :-1], tail_mask.to(device)], dim=1),
                 position_ids=tail_positions, cache=cache, use_cache=True)
    scores.add(tail.logits, targets.to(device))
    tail.cache.crop(-tokens.shape[1])
    return tail.cache
