"""Continuous batching for the CPU engine: one running batch that requests join and leave between decode steps,
each row with its own adapter (the engine's stacked adapters, workloads.serve.engine.stacked_lora).

Transformers' own continuous batching packs every request into one row, where per-row adapters cannot ride, so
the batch is kept here: left-padded rows over one KV cache (`DynamicCache`, `[rows, heads, time, dim]`
per layer) with an attention mask and each row's own positions. Joining requests are prefilled together in one
forward, their first token sampled and sent at once, then their cache is padded to the batch's length (or the
batch's to theirs) and appended; a finished or cancelled row is dropped from the cache, and the columns no row
uses any more are cut off the left. Sampling is one set of tensor operations for all rows (temperature, top-p,
the exponential race for a draw); text is detokenized incrementally (vLLM's prefix/read offsets). With an
EngineMetrics (workloads.serve.engine.metrics) the batch reports each request's start, tokens and end to it before
the request hears of them, so a scrape after a reply counts that reply.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from workloads.serve.engine.metrics import EngineMetrics


class Request(Protocol):
    """What a batch row needs of a request (workloads.serve.engine.server.Generation)."""

    prompt_ids: list[int]
    adapter: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    ignore_eos: bool
    cancelled: threading.Event

    def emit(self, event: tuple) -> None: ...


@dataclass
class Row:
    request: Request
    generator: torch.Generator | None
    produced: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0


def next_text(tokenizer: Any, ids: list[int], prefix_offset: int, read_offset: int) -> tuple[str, int, int]:
    """The text the newest tokens add, and the new offsets (nothing while the tail is an incomplete character)."""
    before = tokenizer.decode(ids[prefix_offset:read_offset], skip_special_tokens=True)
    after = tokenizer.decode(ids[prefix_offset:], skip_special_tokens=True)
    if len(after) > len(before) and not after.endswith("\ufffd"):
        return after[len(before):], read_offset, len(ids)
    return "", prefix_offset, read_offset


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
           generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """One token per row: argmax where temperature <= 0, else a draw from the tempered, top-p-cut distribution
    (argmax of p / Exp(1) noise; a row with a seed draws its noise from its own generator)."""
    logits = logits.float()
    greedy = logits.argmax(-1)
    if bool((temperature <= 0).all()):
        return greedy
    probs = torch.softmax(logits / temperature.clamp(min=1e-5)[:, None], dim=-1)
    if bool((top_p < 1.0).any()):
        ordered, order = probs.sort(dim=-1, descending=True)
        ordered = ordered.masked_fill(ordered.cumsum(-1) - ordered >= top_p[:, None], 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, ordered)
    noise = torch.empty_like(probs).exponential_()
    for i, generator in enumerate(generators):
        if generator is not None:
            noise[i].exponential_(generator=generator)
    drawn = (probs / noise).argmax(-1)
    return torch.where(temperature <= 0, greedy, drawn)


def left_padded(prompts: Sequence[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompts padded on the left to one width: their ids, attention mask and each row's positions."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def pad_left(cache: Any, columns: int) -> None:
    """`columns` zero columns before every layer's keys and values (masked out: never attended)."""
    if columns <= 0:
        return
    for layer in cache.layers:
        layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, columns, 0))
        layer.values = torch.nn.functional.pad(layer.values, (0, 0, columns, 0))


def append_rows(cache: Any, other: Any) -> None:
    for layer, extra in zip(cache.layers, other.layers):
        layer.keys = torch.cat([layer.keys, extra.keys], dim=0)
        layer.values = torch.cat([layer.values, extra.values], dim=0)


def cut_left(cache: Any, columns: int) -> None:
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, columns:, :]
        layer.values = layer.values[:, :, columns:, :]


FINISHED = ("stop", "length")


class RunningBatch:
    """The rows being decoded and their shared KV cache. `forward(input_ids, mask, positions, cache, names)`
    runs the model (names: each row's adapter) and returns (last-position logits, cache). With `metrics`, requests
    carry their RequestTimes (`times`)."""

    def __init__(self, forward: Callable[..., tuple[torch.Tensor, Any]], tokenizer: Any, eos: set[int], pad: int,
                 device: str, metrics: EngineMetrics | None = None) -> None:
        self.forward, self.tokenizer, self.eos, self.pad, self.device = forward, tokenizer, eos, pad, device
        self.metrics = metrics
        self.rows: list[Row] = []
        self.cache: Any = None
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.positions = torch.zeros((0, 1), dtype=torch.long)
        self.last = torch.zeros((0, 1), dtype=torch.long)
        """each row's newest token, not yet in the cache"""

    @property
    def adapters(self) -> set[str]:
        return {row.request.adapter for row in self.rows}

    def join(self, requests: Sequence[Request]) -> None:
        """Prefill `requests` together, send each its first token, and add the rows still going to the batch."""
        if self.metrics is not None:
            now = time.monotonic()
            for request in requests:
                self.metrics.scheduled(request, now)
        ids, mask, positions = left_padded([r.prompt_ids for r in requests], self.pad)
        logits, cache = self.forward(ids.to(self.device), mask.to(self.device), positions.to(self.device), None,
                                     [r.adapter for r in requests])
        rows = [Row(r, torch.Generator().manual_seed(r.seed) if r.seed is not None else None) for r in requests]
        tokens = self.sample(logits, rows)
        if self.metrics is not None:
            self.metrics.iteration(sum(len(r.prompt_ids) for r in requests), len(rows))
        if self.cache is None:
            self.cache, self.mask, self.positions, self.last = cache, mask, positions[:, -1:] + 1, tokens[:, None]
            self.rows = rows
        else:
            grow = ids.shape[1] - self.mask.shape[1]
            pad_left(self.cache, grow)
            pad_left(cache, -grow)
            self.mask = torch.cat([torch.nn.functional.pad(self.mask, (max(grow, 0), 0)),
                                   torch.nn.functional.pad(mask, (max(-grow, 0), 0))])
            append_rows(self.cache, cache)
            self.positions = torch.cat([self.positions, positions[:, -1:] + 1])
            self.last = torch.cat([self.last, tokens[:, None]])
            self.rows += rows
        self.advance(tokens[-len(rows):].tolist(), offset=len(self.rows) - len(rows))

    def step(self) -> None:
        """One decode step for every row."""
        self.mask = torch.cat([self.mask, torch.ones((len(self.rows), 1), dtype=self.mask.dtype)], dim=1)
        logits, self.cache = self.forward(self.last.to(self.device), self.mask.to(self.device),
                                          self.positions.to(self.device), self.cache,
                                          [row.request.adapter for row in self.rows])
        tokens = self.sample(logits, self.rows)
        if self.metrics is not None:
            self.metrics.iteration(0, len(self.rows))
        self.positions = self.positions + 1
        self.last = tokens[:, None]
        self.advance(tokens.tolist(), offset=0)

    def sample(self, logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
        temperature = torch.tensor([row.request.temperature for row in rows], dtype=torch.float32)
        top_p = torch.tensor([row.request.top_p for row in rows], dtype=torch.float32)
        return sample(logits.cpu(), temperature, top_p, [row.generator for row in rows])

    def advance(self, tokens: list[int], offset: int) -> None:
        """Send the rows from `offset` on their new token's text; drop the rows that ended or were cancelled."""
        ended, now = [], time.monotonic()
        for i, token in enumerate(tokens, start=offset):
            row = self.rows[i]
            request = row.request
            if request.cancelled.is_set():
                ended.append(i)
                self.ended(row, "abort", now)
                continue
            finish = "stop" if token in self.eos and not request.ignore_eos else None
            if self.metrics is not None:
                self.metrics.token(request, now, counted=finish is None)
            if finish is None:
                row.produced.append(token)
                text, row.prefix_offset, row.read_offset = next_text(self.tokenizer, row.produced, row.prefix_offset,
                                                                     row.read_offset)
                if text:
                    request.emit(("delta", text))
                if len(row.produced) >= request.max_tokens:
                    finish = "length"
            if finish:
                self.ended(row, finish, now)
                request.emit(("done", finish, len(request.prompt_ids), len(row.produced)))
                ended.append(i)
        if ended:
            self.drop(ended)

    def ended(self, row: Row, reason: str, now: float) -> None:
        if self.metrics is not None:
            self.metrics.finished(row.request, reason, len(row.produced), now)

    def drop(self, indexes: list[int]) -> None:
        keep = [i for i in range(len(self.rows)) if i not in set(indexes)]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = None
            self.mask = torch.zeros((0, 0), dtype=torch.long)
            return
        index = torch.tensor(keep)
        self.cache.batch_select_indices(index.to(self.device))
        self.mask, self.positions, self.last = self.mask[index], self.positions[index], self.last[index]
        unused = int((self.mask.sum(0) == 0).long().cumprod(0).sum())
        if unused:
            cut_left(self.cache, unused)
            self.mask = self.mask[:, unused:]

    def fail(self, message: str) -> None:
        now = time.monotonic()
        for row in self.rows:
            self.ended(row, "error", now)
            row.request.emit(("error", message))
