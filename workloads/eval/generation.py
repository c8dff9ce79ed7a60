"""Prompts from the tokenized test split, batched greedy generation, and timed single-prompt runs.

A prompt is the tokenized test row up to its final answer (`prompt_length`), so generation sees the context
exactly as training and perplexity saw it (shortened the same way when it was over max_length); the
reference is that row's final answer from the test JSONL. After a one-token warm-up, the first
`timing_runs` prompts are generated one at a time and timed (time to first token, tokens per second), the
others in left-padded batches of `generation_batch_size`; the report keeps the timed runs' medians, so one
stalled prompt cannot swing the comparison, and the timing costs no generation beyond the warm-up. Given the
tokenized rows, a batch's prefill also scores them for perplexity (workloads/eval/prefill.py): one forward over
each prompt serves both.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.generation.streamers import BaseStreamer

from documents.chat_row import ChatRowError, read_chat_rows
from workloads.eval.prefill import NllSum, prefill_and_score


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
    decode_tokens_per_second: float | None = None
    """tokens after the first over the seconds after it (no prefill); None when no timed reply had two tokens."""


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
    try:
        rows = [row for _, _, row in read_chat_rows(test_jsonl)]
    except ChatRowError as error:
        raise ValueError(f"{error}; run the prepare stage again") from None
    prompts = []
    for item in dataset.select(range(min(limit, len(dataset)))):
        try:
            user, reference = _final_turns(rows[item["row"]].turns())
        except (IndexError, ValueError) as error:
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
def generate_batch(model, tokenizer, prompts: list[Prompt], max_new_tokens: int, rows: list[dict] | None = None,
                   scores: NllSum | None = None) -> list[Generation]:
    """Greedy replies to `prompts` in one left-padded batch. With `rows` (the tokenized rows the prompts were cut
    from) and `scores`, the prefill the replies start from also scores the rows' labelled tokens
    (workloads.eval.prefill)."""
    device = next(model.parameters()).device
    width = max(len(p.ids) for p in prompts)
    ids = torch.full((len(prompts), width), _pad_id(tokenizer), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt.ids):] = torch.tensor(prompt.ids)
        mask[i, width - len(prompt.ids):] = 1
    ids, mask = ids.to(device), mask.to(device)
    cache = None
    if rows is not None and scores is not None:
        cache = prefill_and_score(model, ids, mask, rows, _pad_id(tokenizer), scores)
    output = model.generate(input_ids=ids, attention_mask=mask, cache=cache, do_sample=False,
                            max_new_tokens=max_new_tokens, pad_token_id=_pad_id(tokenizer))
    return [_reply(tokenizer, output[i, width:].tolist()) for i in range(len(prompts))]


def generate_all(model, tokenizer, prompts: list[Prompt], max_new_tokens: int, batch_size: int, timing_runs: int,
                 seed: int, desc: str, rows: list[dict] | None = None,
                 scores: NllSum | None = None) -> tuple[list[Generation], float, Timing]:
    """Replies in prompt order, the seconds generation took, and the timing: after a one-token warm-up, the
    first `timing_runs` prompts are generated one at a time and timed (their replies are kept), the rest in
    batches of similar lengths. With `rows` (prompt i cut from rows[i]) and `scores`, each batch's prefill scores
    its rows too, and `scores.rows` names them."""
    torch.manual_seed(seed)
    model.eval()
    timed = min(timing_runs, len(prompts))
    start = time.perf_counter()
    _timed(model, tokenizer, min(prompts, key=lambda p: len(p.ids)), 1)
    replies: dict[int, Generation] = {}
    runs = []
    for index in tqdm(range(timed), desc=f"{desc} (timed)", unit="prompt"):
        replies[index], ttft, speed, decode = _timed(model, tokenizer, prompts[index], max_new_tokens)
        runs.append((ttft, speed, decode))
    order = sorted(range(timed, len(prompts)), key=lambda i: len(prompts[i].ids))
    for first in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch"):
        chunk = order[first: first + batch_size]
        scored = [rows[i] for i in chunk] if rows is not None else None
        replies.update(zip(chunk, generate_batch(model, tokenizer, [prompts[i] for i in chunk], max_new_tokens,
                                                 scored, scores)))
        if scored is not None and scores is not None:
            scores.rows.update(chunk)
    decodes = [d for _, _, d in runs if d is not None]
    timing = Timing(statistics.median(t for t, _, _ in runs), statistics.median(s for _, s, _ in runs), len(runs),
                    statistics.median(decodes) if decodes else None)
    return [replies[i] for i in range(len(prompts))], time.perf_counter() - start, timing


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
def _timed(model, tokenizer, prompt: Prompt, max_new_tokens: int) -> tuple[Generation, float, float, float | None]:
    """One greedy reply, the seconds to its first token, its tokens per second (prefill included) and its decode
    rate (tokens after the first over the seconds after the first; None for a one-token reply)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt.ids], device=device)
    clock = _FirstTokenClock()
    start = time.perf_counter()
    output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=max_new_tokens, pad_token_id=_pad_id(tokenizer), streamer=clock)
    total = time.perf_counter() - start
    reply = _reply(tokenizer, output[0, ids.shape[1]:].tolist())
    ttft = clock.first_token_at - start
    decode = (reply.tokens - 1) / (total - ttft) if reply.tokens > 1 and total > ttft else None
    return reply, ttft, reply.tokens / total, decode
