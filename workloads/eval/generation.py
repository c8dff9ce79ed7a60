"""Prompts from the tokenized test split, batched greedy generation, and timed single-prompt runs.

A prompt is the tokenized test row up to its final answer (`prompt_length`), so generation sees the context
exactly as training and perplexity saw it (shortened the same way when it was over max_length); the
reference is that row's final answer from the test JSONL. Replies come from left-padded batches of
`generation_batch_size` prompts. Speed comes separately from `timing_runs` single-prompt generations after
one warm-up, each forced to `max_new_tokens` new tokens so both models do the same work; the report keeps
their medians, so one stalled run cannot swing the comparison.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.generation.streamers import BaseStreamer


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    input: str
    reference: str


@dataclass(frozen=True)
class Generation:
    text: str
    tokens: int


@dataclass(frozen=True)
class Timing:
    """Medians over the timed runs (seconds, tokens per second) and how many runs they summarize."""

    ttft_s: float
    tokens_per_second: float
    runs: int


def _final_turns(messages: list[dict[str, str]]) -> tuple[str, str]:
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    users = [m["content"] for m in messages[:last] if m["role"] == "user"]
    return (users[-1] if users else ""), messages[last]["content"]


def read_prompts(dataset, test_jsonl: Path, limit: int) -> list[Prompt]:
    """The first `limit` tokenized test rows as generation prompts, with their reference answers."""
    if "prompt_length" not in dataset.column_names or "row" not in dataset.column_names:
        raise ValueError("tokenized test split has no prompt_length/row columns (written by an older prepare): "
                         "run the prepare stage again")
    if not test_jsonl.exists():
        raise FileNotFoundError(f"{test_jsonl}: test split not found (run the data stage first)")
    with test_jsonl.open(encoding="utf-8") as handle:
        lines = [line for line in handle if line.strip()]
    prompts = []
    for item in dataset.select(range(min(limit, len(dataset)))):
        try:
            user, reference = _final_turns(json.loads(lines[item["row"]])["messages"])
        except (IndexError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{test_jsonl}: row {item['row']}: not the conversation the tokenized split was made "
                             f"from ({error!r}); run the prepare stage again") from None
        prompts.append(Prompt(item["input_ids"][: item["prompt_length"]], user, reference))
    if not prompts:
        raise ValueError(f"{test_jsonl}: no conversations")
    return prompts


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _reply(tokenizer, new: list[int]) -> Generation:
    if tokenizer.eos_token_id in new:
        new = new[: new.index(tokenizer.eos_token_id)]
    return Generation(tokenizer.decode(new, skip_special_tokens=True), len(new))


@torch.no_grad()
def generate_batch(model, tokenizer, prompts: list[Prompt], max_new_tokens: int) -> list[Generation]:
    """Greedy replies to `prompts` in one left-padded batch."""
    device = next(model.parameters()).device
    width = max(len(p.ids) for p in prompts)
    ids = torch.full((len(prompts), width), _pad_id(tokenizer), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt.ids):] = torch.tensor(prompt.ids)
        mask[i, width - len(prompt.ids):] = 1
    output = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                            max_new_tokens=max_new_tokens, pad_token_id=_pad_id(tokenizer))
    return [_reply(tokenizer, output[i, width:].tolist()) for i in range(len(prompts))]


def generate_all(model, tokenizer, prompts: list[Prompt], max_new_tokens: int, batch_size: int, seed: int,
                 desc: str) -> tuple[list[Generation], float]:
    """Replies in prompt order, from batches of similar lengths; and the seconds all batches took."""
    torch.manual_seed(seed)
    model.eval()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].ids))
    replies: dict[int, Generation] = {}
    start = time.perf_counter()
    for first in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch"):
        chunk = order[first: first + batch_size]
        for index, reply in zip(chunk, generate_batch(model, tokenizer, [prompts[i] for i in chunk], max_new_tokens)):
            replies[index] = reply
    return [replies[i] for i in range(len(prompts))], time.perf_counter() - start


class _FirstTokenClock(BaseStreamer):
    """Records when generate() emits its first new token (the first put() carries the prompt)."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_token_at: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()


@torch.no_grad()
def _timed(model, tokenizer, prompt: Prompt, new_tokens: int) -> tuple[float, float]:
    """(seconds to the first token, tokens per second) of one greedy generation of exactly `new_tokens`."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt.ids], device=device)
    clock = _FirstTokenClock()
    start = time.perf_counter()
    output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=_pad_id(tokenizer),
                            streamer=clock)
    total = time.perf_counter() - start
    return clock.first_token_at - start, (output.shape[1] - ids.shape[1]) / total


def time_generation(model, tokenizer, prompts: list[Prompt], max_new_tokens: int, runs: int, desc: str) -> Timing:
    """One untimed warm-up, then `runs` timed generations cycling through the prompts; medians."""
    model.eval()
    _timed(model, tokenizer, prompts[0], min(4, max_new_tokens))
    measured = [_timed(model, tokenizer, prompts[i % len(prompts)], max_new_tokens)
                for i in tqdm(range(runs), desc=desc, unit="run")]
    return Timing(statistics.median(t for t, _ in measured), statistics.median(s for _, s in measured), runs)
