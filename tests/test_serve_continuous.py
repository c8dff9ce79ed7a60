"""The CPU engine's continuous batching (workloads.serve.engine.batching): vectorized sampling against the
distribution it must draw from, incremental detokenization against a whole decode, and rows that join and leave
a running batch answering as when each runs alone (the tiny model, real LoRA adapters, in process)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from adapter_fixtures import ADAPTERS, AdapterRuns

from workloads.serve.engine.batching import RunningBatch, next_text, sample
from workloads.serve.engine.server import BASE_ROW, AdapterModel

NAMES = list(ADAPTERS)


def test_sampling_draws_from_the_tempered_top_p_distribution() -> None:
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    rows = 20_000
    logits = probs.log().repeat(rows, 1)
    ones = torch.ones(rows)
    counts = torch.bincount(sample(logits, ones, ones, [None] * rows), minlength=4) / rows
    assert torch.allclose(counts, probs, atol=0.015), counts
    cut = torch.bincount(sample(logits, ones, torch.full((rows,), 0.8), [None] * rows), minlength=4) / rows
    assert torch.allclose(cut, torch.tensor([0.6, 0.25, 0.0, 0.0]) / 0.85, atol=0.015), cut  # 0.6 + 0.25 >= 0.8
    hot = torch.softmax(probs.log() / 2.0, -1)
    warm = torch.bincount(sample(logits, torch.full((rows,), 2.0), ones, [None] * rows), minlength=4) / rows
    assert torch.allclose(warm, hot, atol=0.015), warm
    greedy = sample(logits[:3], torch.tensor([0.0, 0.0, 0.0]), torch.ones(3), [None] * 3)
    assert greedy.tolist() == [0, 0, 0]


def test_a_seeded_row_draws_the_same_tokens_whatever_its_neighbours() -> None:
    logits = torch.randn(3, 50)
    seeded = [torch.Generator().manual_seed(7), None, None]
    first = sample(logits, torch.ones(3), torch.ones(3), seeded)[0]
    again = sample(logits.flip(0).flip(0), torch.ones(3), torch.ones(3), [torch.Generator().manual_seed(7), None, None])[0]
    assert first == again


def test_incremental_text_is_the_whole_decode(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "naïve café — 東京 🙂 costs 3½ ¥, right?"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces, prefix, read = [], 0, 0
    for n in range(1, len(ids) + 1):
        piece, prefix, read = next_text(tokenizer, ids[:n], prefix, read)
        assert "\ufffd" not in piece
        pieces.append(piece)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True) == text


@dataclass
class Ask:
    prompt_ids: list[int]
    adapter: str
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)
    events: list = field(default_factory=list)

    def emit(self, event: tuple) -> None:
        self.events.append(event)

    @property
    def text(self) -> str:
        return "".join(e[1] for e in self.events if e[0] == "delta")

    @property
    def finish(self) -> tuple:
        return self.events[-1]


@pytest.fixture(scope="module")
def engine(adapter_runs: AdapterRuns) -> AdapterModel:
    folders = {name: adapter_runs.store_dir.parent / "adapters" / name for name in NAMES}
    return AdapterModel(adapter_runs.run.base_model_dir, folders, "float32", "cpu", 8)


def batch_of(engine: AdapterModel) -> RunningBatch:
    return RunningBatch(engine.forward, engine.tokenizer, engine.eos, engine.pad, "cpu")


def alone(engine: AdapterModel, ask: Ask) -> Ask:
    copy = Ask(ask.prompt_ids, ask.adapter, ask.max_tokens)
    batch = batch_of(engine)
    with torch.inference_mode():
        batch.join([copy])
        while batch.rows:
            batch.step()
    return copy


def test_rows_that_join_and_leave_midway_answer_as_alone(engine: AdapterModel) -> None:
    prompt = lambda text: engine.prompt_ids([{"role": "user", "content": text}])  # noqa: E731
    asks = [Ask(prompt("What is a bond?"), NAMES[0], 14), Ask(prompt("Hi"), BASE_ROW, 6),
            Ask(prompt("Summarise the quarter's earnings in one line, please."), NAMES[1], 12),
            Ask(prompt("Name a currency."), NAMES[2], 9), Ask(prompt("What is a bond?"), NAMES[1], 10)]
    batch = batch_of(engine)
    schedule = {0: [asks[0]], 2: [asks[1], asks[2]], 5: [asks[3]], 9: [asks[4]]}
    sizes = []
    with torch.inference_mode():
        for step in range(60):
            if step in schedule:
                batch.join(schedule[step])
            if batch.rows:
                batch.step()
            sizes.append(len(batch.rows))
            if step > max(schedule) and not batch.rows:
                break
    assert max(sizes) >= 3 and sizes[-1] == 0
    assert batch.mask.shape[1] == 0, "the cache's columns are all dropped with the last row"
    for ask in asks:
        solo = alone(engine, ask)
        assert ask.text == solo.text and ask.finish == solo.finish, (ask.adapter, ask.text, solo.text)
        assert ask.finish[0] == "done" and ask.finish[3] <= ask.max_tokens
    assert len({a.text for a in asks[:4]}) == 4


def test_a_cancelled_row_leaves_and_the_cache_shrinks(engine: AdapterModel) -> None:
    prompt = engine.prompt_ids([{"role": "user", "content": "Tell me a long story about markets."}])
    long, short = Ask(prompt, NAMES[0], 40), Ask(prompt[:5], BASE_ROW, 40)
    batch = batch_of(engine)
    with torch.inference_mode():
        batch.join([long, short])
        batch.step()
        long.cancelled.set()
        batch.step()
        assert [row.request for row in batch.rows] == [short]
        assert batch.mask.shape[1] == len(short.prompt_ids) + 2, "the long prompt's columns are cut"
        assert batch.cache.layers[0].keys.shape[2] == batch.mask.shape[1]


def test_a_row_that_ignores_eos_runs_to_max_tokens(engine: AdapterModel) -> None:
    """Issue 42, item 12: vLLM's `ignore_eos`, so that a benchmark compares equal output lengths. With every
    token an end-of-sequence token, a row stops at once unless it ignores them; then it runs to max_tokens, in
    the same batch as one that stops."""
    prompt = engine.prompt_ids([{"role": "user", "content": "What is a bond?"}])
    stops, runs = Ask(prompt, NAMES[0], 7), Ask(prompt, BASE_ROW, 7, ignore_eos=True)
    vocabulary = set(range(engine.model.config.vocab_size))
    batch = RunningBatch(engine.forward, engine.tokenizer, vocabulary, engine.pad, "cpu")
    with torch.inference_mode():
        batch.join([stops, runs])
        while batch.rows:
            batch.step()
    assert stops.finish == ("done", "stop", len(prompt), 0)
    assert runs.finish == ("done", "length", len(prompt), 7)
