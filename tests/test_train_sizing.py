"""`auto` micro-batch sizing and activation checkpointing from the memory estimate (planning/batches.py),
and the preview's model-fits policy using the same plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from documents.run_config import parse_run_config
from planning.memory import GIB, estimate
from planning.model_shapes import KNOWN
from planning.batches import ALIGN, DoesNotFit, plan_batches, plan_inputs

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


# Peak allocated memory measured on one H100 80GB HBM3 (79.19 GiB), 2026-11-23 (docs/training.md): Qwen3-14B
# shape, dev.json's QLoRA with peft's fp32 upcast of the frozen norms/embeddings/LM head, 16,384 packed tokens.
H100_GIB = 79.19
MEASURED_14B_PEAK_GIB = {True: 35.42, False: 55.07}  # fused loss: with / without


@pytest.mark.parametrize("fused", [True, False])
def test_14b_qlora_on_an_h100_plans_what_was_measured(fused: bool) -> None:
    """The H100 benchmark's plan (one micro-batch of 16,384 tokens, checkpointing) and its estimate within 10% of
    the peak measured with those settings."""
    run = _dev(micro_batch_tokens="auto", gradient_checkpointing=True, gradient_accumulation_steps=16,
               fused_loss=fused, kbit_upcast=True)
    plan = plan_batches(run, QWEN14, H100_GIB)
    assert (plan.micro_batch_tokens, plan.gradient_accumulation_steps, plan.gradient_checkpointing) == (16384, 1, True)
    assert plan.estimate_gib == pytest.approx(MEASURED_14B_PEAK_GIB[fused], rel=0.10)


def test_frozen_weights_in_the_compute_dtype_halve_the_checkpointed_stream() -> None:
    """Without the fp32 upcast (the default) the same step plans the same micro-batch in less memory: the
    checkpointed layer inputs are bf16 (40 layers x 16,384 tokens x 5,120 x 2 B = 6.25 GiB instead of 12.5) and
    the embeddings and LM head are bf16 (2 x 151,936 x 5,120 x 2 B less)."""
    settings = {"micro_batch_tokens": "auto", "gradient_checkpointing": True, "gradient_accumulation_steps": 16,
                "fused_loss": True}
    upcast = plan_batches(_dev(**settings, kbit_upcast=True), QWEN14, H100_GIB)
    default = plan_batches(_dev(**settings), QWEN14, H100_GIB)
    assert (default.micro_batch_tokens, default.gradient_checkpointing) == (16384, True)
    stream = 40 * 16384 * 5120 * 2 / GIB
    heads = 2 * 151936 * 5120 * 2 / GIB
    assert upcast.estimate_gib - default.estimate_gib > stream + heads


def test_auto_checkpointing_is_off_when_the_step_fits_without_it() -> None:
    run = _dev(micro_batch_tokens="auto", gradient_checkpointing="auto", gradient_accumulation_steps=4)
    small = plan_batches(run, SMOL, 80)
    assert small.gradient_checkpointing is False and small.micro_batch_tokens == 4096


@pytest.mark.parametrize("fused", [True, False])
def test_14b_on_an_h100_trades_recomputation_for_smaller_micro_batches(fused: bool) -> None:
    """The 14B step (16 x 1,024 tokens) does not fit in one micro-batch without recomputation, but equal
    micro-batches of at least 2,048 tokens do: `auto` takes the fewest of those and no recomputation."""
    run = _dev(micro_batch_tokens="auto", gradient_checkpointing="auto", gradient_accumulation_steps=16,
               fused_loss=fused)
    budget = 0.9 * H100_GIB
    plan = plan_batches(run, QWEN14, H100_GIB)
    assert plan.gradient_checkpointing is False and plan.micro_batch_tokens >= 2048
    assert plan.micro_batch_tokens * plan.gradient_accumulation_steps >= 16 * 1024
    assert _fits(run, QWEN14, plan.micro_batch_tokens, False, budget)
    fewer = plan.gradient_accumulation_steps - 1
    assert not _fits(run, QWEN14, ALIGN * -(-16 * 1024 // fewer // ALIGN), False, budget)
    assert not _fits(run, QWEN14, 16 * 1024, False, budget)


def test_checkpointing_stays_on_when_only_small_micro_batches_fit_without_it() -> None:
    """On a 48 GB GPU 14B fits under 2,048 tokens per micro-batch without recomputation: `auto` keeps it on
    and the whole step in one checkpointed micro-batch."""
    gib = 44.4  # an L40S 48GB's usable memory, assumed (not measured): PyTorch reports less than the nominal size
    run = _dev(micro_batch_tokens="auto", gradient_checkpointing="auto", gradient_accumulation_steps=16,
               fused_loss=True)
    assert not _fits(run, QWEN14, 2048, False, 0.9 * gib)
    plan = plan_batches(run, QWEN14, gib)
    assert (plan.micro_batch_tokens, plan.gradient_accumulation_steps, plan.gradient_checkpointing) == (16384, 1, True)


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
    with pytest.raises(ValueError, match="train.micro_batch_tokens sizes packed micro-batches: it needs batching "
                       "packed or auto"):
        _dev(micro_batch_tokens=2048, batching="grouped")
    assert _dev(micro_batch_tokens=2048, batching="auto").train.micro_batch_tokens == 2048


def test_padded_micro_batches_keep_the_configured_rows() -> None:
    """Once `auto` has chosen padding, micro_batch_tokens no longer sizes anything: micro_batch_size rows of up to
    max_length tokens, the configured accumulation."""
    run = _dev(micro_batch_tokens=4096, batching="auto")
    packed = plan_batches(run, QWEN14, None)
    padded = plan_batches(run, QWEN14, None, "grouped")
    assert (packed.micro_batch_tokens, packed.gradient_accumulation_steps) == (4096, 2)
    expected_tokens = run.train.micro_batch_size * run.data.max_length
    assert (padded.micro_batch_tokens, padded.gradient_accumulation_steps) == (
        expected_tokens, run.train.gradient_accumulation_steps)


def test_tokens_per_step_is_one_count_for_the_batch_plan_and_the_cost_model() -> None:
    """The trainer's plan and the cost model's passes over the data count a step's tokens the same way: by hand,
    4 rows x 2 accumulation x 512 tokens per packed micro-batch = 4,096 tokens per rank, 3 ranks = 12,288; padded
    rows of 300 tokens on average: 4 x 2 x 300 x 3 = 7,200."""
    from documents.sections.train import TrainConfig
    from planning.batches import tokens_per_step

    train = TrainConfig(micro_batch_size=4, gradient_accumulation_steps=2, max_length=512)
    assert tokens_per_step(train, 512, "packed") == 4096
    assert tokens_per_step(train, 512, "packed", ranks=3, tokens_per_row=300) == 12288
    assert tokens_per_step(train, 512, "grouped", ranks=3, tokens_per_row=300) == 7200
    assert tokens_per_step(train, 512, "grouped", ranks=3) == 12288
