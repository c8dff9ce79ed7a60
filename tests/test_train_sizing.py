"""`auto` micro-batch sizing and activation checkpointing from the memory estimate (workloads/train/sizing.py),
and the preview's model-fits policy using the same plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.config import parse_run_config
from workloads.train.memory import GIB, estimate
from workloads.train.model_shapes import KNOWN
from workloads.train.sizing import ALIGN, DoesNotFit, plan_batches, plan_inputs

ROOT = Path(__file__).resolve().parents[1]
QWEN14 = KNOWN["Qwen/Qwen3-14B"]
SMOL = KNOWN["HuggingFaceTB/SmolLM2-135M-Instruct"]


def _dev(**train: object) -> object:
    data = json.loads((ROOT / "workloads" / "configs" / "dev.json").read_text())
    data["train"].update(train)
    return parse_run_config(data, "dev.json")


def _fits(run: object, shape: object, tokens: int, checkpointing: bool, budget_gib: float) -> bool:
    inputs = plan_inputs(run, plan_batches(run, shape, None)).model_copy(
        update={"micro_batch": 1, "max_length": tokens, "gradient_checkpointing": checkpointing})
    return estimate(shape, inputs).total <= budget_gib * GIB


@pytest.mark.parametrize(("gpu_gib", "accumulation"), [(80, 16), (48, 16), (24, 8)])
def test_auto_keeps_the_global_batch_in_the_fewest_micro_batches_that_fit(gpu_gib: float, accumulation: int) -> None:
    run = _dev(micro_batch_tokens="auto", gradient_checkpointing=True, gradient_accumulation_steps=accumulation)
    plan = plan_batches(run, QWEN14, gpu_gib)
    step = 1 * accumulation * 1024
    assert plan.step_tokens == step and plan.source == "auto" and plan.gradient_checkpointing
    assert plan.micro_batch_tokens % ALIGN == 0 and plan.micro_batch_tokens >= 1024
    assert plan.micro_batch_tokens * plan.gradient_accumulation_steps >= step
    assert (plan.micro_batch_tokens - ALIGN) * plan.gradient_accumulation_steps < step
    budget = 0.9 * gpu_gib
    assert _fits(run, QWEN14, plan.micro_batch_tokens, True, budget)
    assert plan.estimate_gib <= budget
    if plan.gradient_accumulation_steps > 1:  # one accumulation step fewer would not fit
        fewer = plan.gradient_accumulation_steps - 1
        assert not _fits(run, QWEN14, ALIGN * -(-step // fewer // ALIGN), True, budget)


def test_14b_qlora_on_an_h100_plans_what_was_measured() -> None:
    """The plan of the H100 benchmark (docs/training.md): one micro-batch of 16,384 tokens with checkpointing."""
    run = _dev(micro_batch_tokens="auto", gradient_checkpointing="auto", gradient_accumulation_steps=16,
               fused_loss=True)
    plan = plan_batches(run, QWEN14, 79.19)
    assert (plan.micro_batch_tokens, plan.gradient_accumulation_steps, plan.gradient_checkpointing) == (16384, 1, True)
    assert plan.estimate_gib == pytest.approx(36.79, abs=0.01)
    unfused = plan_batches(_dev(micro_batch_tokens="auto", gradient_checkpointing="auto",
                                gradient_accumulation_steps=16), QWEN14, 79.19)
    assert unfused.estimate_gib > plan.estimate_gib + 20  # 16,384 x 151,936 logits in fp32, twice


def test_auto_checkpointing_is_off_when_the_step_fits_without_it() -> None:
    run = _dev(micro_batch_tokens="auto", gradient_checkpointing="auto", gradient_accumulation_steps=4)
    small = plan_batches(run, SMOL, 80)
    assert small.gradient_checkpointing is False and small.micro_batch_tokens == 4096
    big = plan_batches(run, QWEN14, 80)  # 14B without recomputation fits only ~2k tokens: below EFFICIENT_TOKENS
    assert big.gradient_checkpointing is True
    assert not _fits(run, QWEN14, 4096, False, 72)


def test_without_a_gpu_the_configured_sizes_stand() -> None:
    run = _dev(micro_batch_tokens="auto", gradient_checkpointing="auto")
    plan = plan_batches(run, QWEN14, None)
    assert (plan.micro_batch_tokens, plan.gradient_accumulation_steps, plan.gradient_checkpointing) == (1024, 8, False)
    assert plan.source == "config"


def test_a_model_that_cannot_fit_names_the_budget() -> None:
    run = _dev(micro_batch_tokens="auto", quantization="none")
    with pytest.raises(DoesNotFit, match=r"not even one 1024-token sequence per micro-batch fits 90% of 24 GiB"):
        plan_batches(run, KNOWN["Qwen/Qwen3-32B"], 24)


def test_micro_batch_tokens_need_packing() -> None:
    with pytest.raises(ValueError, match="micro_batch_tokens needs batching: packed"):
        _dev(micro_batch_tokens=2048, batching="grouped")
