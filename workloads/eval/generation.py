"""Prompts from the test split and timed greedy generation (time to first token, tokens/s)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers.generation.streamers import BaseStreamer


@dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, str]]
    input: str
    reference: str


@dataclass(frozen=True)
class Generation:
    text: str
    tokens: int
    ttft_s: float
    total_s: float


def read_prompts(path: Path, limit: int) -> list[Prompt]:
    """First `limit` conversations: everything before the last assistant turn is the prompt, that turn the reference."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: test split not found (run the data stage first)")
    prompts: list[Prompt] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if len(prompts) >= limit:
                break
            if not line.strip():
                continue
            try:
                messages = json.loads(line)["messages"]
                last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
                user = [m["content"] for m in messages[:last] if m["role"] == "user"]
                prompts.append(Prompt(messages[:last], user[-1] if user else "", messages[last]["content"]))
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}: row {number}: expected {{'messages': [...]}} ending with an assistant turn ({error!r})") from None
    if not prompts:
        raise ValueError(f"{path}: no conversations")
    return prompts


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
def generate_timed(model, tokenizer, prompt: Prompt, max_new_tokens: int) -> Generation:
    device = next(model.parameters()).device
    inputs = tokenizer.apply_chat_template(
        prompt.messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    ).to(device)
    clock = _FirstTokenClock()
    start = time.perf_counter()
    output = model.generate(
        **inputs,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        streamer=clock,
    )
    total = time.perf_counter() - start
    new = output[0, inputs["input_ids"].shape[1]:]
    if len(new) and int(new[-1]) == tokenizer.eos_token_id:
        new = new[:-1]
    return Generation(tokenizer.decode(new, skip_special_tokens=True), len(new), clock.first_token_at - start, total)


def generate_all(model, tokenizer, prompts: list[Prompt], max_new_tokens: int, seed: int, desc: str) -> list[Generation]:
    torch.manual_seed(seed)
    model.eval()
    return [generate_timed(model, tokenizer, p, max_new_tokens) for p in tqdm(prompts, desc=desc, unit="prompt")]
