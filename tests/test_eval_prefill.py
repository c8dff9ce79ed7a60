"""The evaluator's shared forward (workloads/eval/prefill.py) against the plain computations it replaces, on the
tiny random Llama: each row's perplexity from its own unpadded forward, each reply from its own `generate`.
Rows of different lengths in one batch, one with a scored earlier turn inside its prompt."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from workloads.eval.generation import Prompt, generate_all, generate_batch
from workloads.eval.perplexity import assistant_nll
from workloads.eval.prefill import NllSum

PAD = 0


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(tiny_model_dir))


def rows() -> list[dict]:
    """Token rows with their labels (-100 where not scored) and prompt lengths; row 2 has a scored earlier reply
    (positions 4-6) inside its prompt, row 3 a one-token answer."""
    generator = torch.Generator().manual_seed(5)
    made = []
    for prompt_length, answer, earlier in ((9, 4, None), (14, 6, None), (12, 3, (4, 7)), (6, 1, None)):
        ids = torch.randint(10, 4000, (prompt_length + answer,), generator=generator).tolist()
        labels = [-100] * prompt_length + ids[prompt_length:]
        if earlier:
            labels[earlier[0]:earlier[1]] = ids[earlier[0]:earlier[1]]
        made.append({"input_ids": ids, "labels": labels, "prompt_length": prompt_length})
    return made


def reference_nll(model, row: dict) -> tuple[float, int]:
    ids = torch.tensor([row["input_ids"]])
    logits = model(input_ids=ids).logits[0, :-1].float()
    target = torch.tensor(row["labels"][1:])
    scored = target != -100
    return torch.nn.functional.cross_entropy(logits[scored], target[scored], reduction="sum").item(), int(scored.sum())


def test_one_forward_scores_the_rows_and_prefills_their_replies(model) -> None:
    model, tokenizer = model
    data = rows()
    prompts = [Prompt(row["input_ids"][: row["prompt_length"]], "", "") for row in data]
    scores = NllSum()
    shared = generate_batch(model, tokenizer, prompts, 6, rows=data, scores=scores)
    alone = [generate_batch(model, tokenizer, [prompt], 6)[0] for prompt in prompts]
    expected = [reference_nll(model, row) for row in data]
    assert [reply.text for reply in shared] == [reply.text for reply in alone]
    assert scores.tokens == sum(tokens for _, tokens in expected) == 17  # answers 4 + 6 + 3 + 1, row 2's earlier 3
    assert scores.nll == pytest.approx(sum(nll for nll, _ in expected), rel=1e-5)


def test_the_plain_perplexity_keeps_only_scored_logits_and_sums_the_same(model) -> None:
    model, _ = model
    data = rows()
    scores = assistant_nll(model, data, 3, PAD, "test")
    expected = [reference_nll(model, row) for row in data]
    assert scores.tokens == sum(tokens for _, tokens in expected)
    assert scores.nll == pytest.approx(sum(nll for nll, _ in expected), rel=1e-5)
    assert math.isfinite(scores.nll) and scores.rows == set()


def test_generate_all_names_the_rows_its_batches_scored(model) -> None:
    model, tokenizer = model
    data = rows()
    prompts = [Prompt(row["input_ids"][: row["prompt_length"]], "", "") for row in data]
    scores = NllSum()
    replies, _, timing = generate_all(model, tokenizer, prompts, 4, 2, 1, 0, "test", rows=data, scores=scores)
    assert scores.rows == {1, 2, 3} and timing.runs == 1
    assert [r.text for r in replies] == [generate_batch(model, tokenizer, [p], 4)[0].text for p in prompts]
    assert scores.tokens == sum(reference_nll(model, row)[1] for row in data[1:])
