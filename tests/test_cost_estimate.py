"""The training-throughput estimator (issue 34): a GPU model without a measurement of its own is priced from the
nearest measured figure, scaled by the two GPUs' published peaks; the figures here are the NVIDIA datasheets'
(H100 SXM: 989.4 dense bf16 TFLOP/s, 3.35 TB/s; L40S: 362.05 TFLOP/s, 864 GB/s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from documents.run_config import RunConfig, load_run_config
from documents.throughput import ThroughputMeasurement
from planning import catalog
from planning.throughput import estimate_throughput

REPO = Path(__file__).resolve().parent.parent
H100_TFLOPS, H100_TBPS = 989.4, 3.35
L40S_TFLOPS, L40S_TBPS = 362.05, 0.864


def h100_row(tokens_per_second: float = 3000.0, micro_batch_tokens: int = 16_384, **extra) -> ThroughputMeasurement:
    return ThroughputMeasurement(
        tokens_per_second_per_device=tokens_per_second, gpu_model="NVIDIA H100 SXM", device="NVIDIA H100 80GB HBM3",
        model="hub:Qwen/Qwen3-14B", method="qlora", date="2026-11-01", source="test bench",
        micro_batch_tokens=micro_batch_tokens, gradient_checkpointing=True, **extra)


def dev_run(**train) -> RunConfig:
    """dev.json (QLoRA of Qwen3-14B, 1,024-token rows, activation checkpointing on) with `train` changes."""
    run = load_run_config(REPO / "workloads/configs/dev.json")
    return run.model_copy(update={"train": run.train.model_copy(update=train)})


def test_the_catalog_carries_each_gpus_published_peaks_with_source_and_date():
    for model, (tflops, tbps) in {"NVIDIA H100 SXM": (H100_TFLOPS, H100_TBPS), "NVIDIA H200 SXM": (989.4, 4.8),
                                  "NVIDIA L40S": (L40S_TFLOPS, L40S_TBPS)}.items():
        peaks = catalog.gpu_peaks(model)
        assert (peaks.bf16_dense_tflops, peaks.memory_tb_per_s) == (tflops, tbps)
        assert "datasheet" in peaks.source and peaks.date.startswith("20")
    assert {p.gpu_model for p in catalog.PLATFORMS.values() if p.gpu_model} <= set(catalog.GPU_PEAKS)


def test_l40s_estimate_from_a_compute_bound_h100_row_scales_by_peak_flops():
    """16,384-token micro-batches of Qwen3-14B: the largest GEMM (5,120 x 17,408) alone does
    16,384*5,120*17,408 / (5,120*17,408 + 16,384*(5,120 + 17,408)) ~ 3,200 FLOP/byte, far above the H100's ridge
    989.4/3.35 ~ 295: compute-bound. Both sides recompute activations, same model: the ratio is the FLOP/s ratio."""
    estimate = estimate_throughput(dev_run(), "NVIDIA L40S", [h100_row()])
    assert estimate is not None and estimate.kind == "estimated" and estimate.bound == "compute"
    assert estimate.tokens_per_second_per_gpu == pytest.approx(3000.0 * 362.05 / 989.4)
    assert estimate.source().startswith("estimated from NVIDIA H100 SXM 2026-11-01, scaled by 0.366")


def test_l40s_estimate_from_a_memory_bound_h100_row_scales_by_bandwidth():
    """64-token micro-batches: the 5,120 x 17,408 GEMM does 64*5,120*17,408 / (5,120*17,408 + 64*22,528)
    ~ 63 FLOP/byte, below the ridge: memory-bound. The stack trains 64-token rows too: the bandwidth ratio."""
    estimate = estimate_throughput(dev_run(max_length=64, micro_batch_size=1), "NVIDIA L40S",
                                   [h100_row(micro_batch_tokens=64)])
    assert estimate is not None and estimate.bound == "memory"
    assert estimate.tokens_per_second_per_gpu == pytest.approx(3000.0 * 0.864 / 3.35)


def test_recomputation_on_one_side_only_changes_the_work_per_token():
    """The stack trains without recomputation (2 passes of 2N FLOPs per token) where the row recomputed (3):
    compute-bound, so 3/2 more tokens per FLOP on top of the FLOP/s ratio."""
    estimate = estimate_throughput(dev_run(gradient_checkpointing=False), "NVIDIA L40S", [h100_row()])
    assert estimate.tokens_per_second_per_gpu == pytest.approx(3000.0 * 362.05 / 989.4 * 3 / 2)


def test_same_gpu_model_and_method_is_borrowed_and_a_stacks_own_run_is_measured():
    bench = h100_row()
    borrowed = estimate_throughput(dev_run(), "NVIDIA H100 SXM", [bench])
    assert borrowed.kind == "borrowed" and borrowed.tokens_per_second_per_gpu == 3000.0
    own = h100_row(2500.0, origin="run", stack="h100", run_id="r1").model_copy(update={"date": "2026-11-20"})
    measured = estimate_throughput(dev_run(), "NVIDIA H100 SXM", [bench, own], stack="h100")
    assert measured.kind == "measured" and measured.tokens_per_second_per_gpu == 2500.0
    assert measured.source().startswith("measured: ")


def test_a_figure_of_the_other_recomputation_is_scaled_not_borrowed():
    """Same GPU, model and method, but the row trained without recomputation (2 passes) where the stack's plan
    recomputes (3): not borrowed as it is, but estimated at 2/3 of it (compute-bound, same FLOP/s); a row of the
    stack's own recomputation, older or not, is borrowed before it."""
    no_recompute = h100_row(4500.0, 3_328).model_copy(update={"gradient_checkpointing": False, "date": "2026-11-26"})
    estimate = estimate_throughput(dev_run(), "NVIDIA H100 SXM", [no_recompute])
    assert estimate.kind == "estimated" and estimate.tokens_per_second_per_gpu == pytest.approx(4500.0 * 2 / 3)
    recomputing = h100_row(3000.0)
    both = estimate_throughput(dev_run(), "NVIDIA H100 SXM", [no_recompute, recomputing])
    assert both.kind == "borrowed" and both.basis == recomputing
    without = estimate_throughput(dev_run(gradient_checkpointing=False), "NVIDIA H100 SXM", [recomputing, no_recompute])
    assert without.kind == "borrowed" and without.basis == no_recompute
    l40s = estimate_throughput(dev_run(), "NVIDIA L40S", [no_recompute, recomputing])
    assert l40s.basis == recomputing and l40s.tokens_per_second_per_gpu == pytest.approx(3000.0 * 362.05 / 989.4)


def test_the_nearest_figure_has_the_same_method_first_then_the_closest_model_size():
    far = h100_row(9000.0).model_copy(update={"model": "hub:Qwen/Qwen3-8B"})
    other_method = h100_row(7000.0).model_copy(update={"method": "lora"})
    near = h100_row(3000.0)
    estimate = estimate_throughput(dev_run(), "NVIDIA L40S", [far, other_method, near])
    assert estimate.basis == near
    estimate = estimate_throughput(dev_run(), "NVIDIA L40S", [far, other_method])
    assert estimate.basis == far


def test_no_figure_no_estimate():
    assert estimate_throughput(dev_run(), "NVIDIA L40S", []) is None


# Qwen3-14B's decoder linears (hidden 5,120, 40 heads and 8 KV heads of 128, intermediate 17,408, 40 layers):
# q, o 5,120 x 5,120; k, v 5,120 x 1,024; gate, up, down 5,120 x 17,408.
QWEN14_LINEAR_PARAMS = 40 * (2 * 5120 * 5120 + 2 * 5120 * 1024 + 3 * 5120 * 17408)
# The bench row's dequantization per micro-batch: 3 passes (forward, input gradients, recomputed forward) over every
# NF4 decoder weight, 0.5 B read + a 64-value block's fp32 absmax (4/64 B) read + 2 B of bf16 written, at 3.35 TB/s.
ROW_DEQUANT_S = 3 * QWEN14_LINEAR_PARAMS * (0.5 + 4 / 64 + 2) / (H100_TBPS * 1e12)
# The row's tokens/s without it: 16,384 tokens in 16,384 / 3,000 s, less the dequantization.
ROW_WITHOUT_DEQUANT = 16_384 / (16_384 / 3000.0 - ROW_DEQUANT_S)


def test_a_full_fine_tune_does_one_more_pass_than_an_adapter():
    """Same GPU, model and recomputation: an adapter's frozen base costs forward + input gradients + recomputed
    forward (3 x 2N FLOPs per token); a full fine-tune adds the weight gradients (4 x 2N): 3/4 of the tokens/s, of
    the QLoRA row's tokens/s without its dequantization (a full fine-tune has no 4-bit base)."""
    assert QWEN14_LINEAR_PARAMS == 13_212_057_600
    estimate = estimate_throughput(dev_run(method="full", quantization="none"), "NVIDIA H100 SXM", [h100_row()])
    assert estimate.kind == "estimated"
    assert estimate.tokens_per_second_per_gpu == pytest.approx(ROW_WITHOUT_DEQUANT * 3 / 4)
    assert "dequantization" in estimate.scaling


def test_a_lora_figure_priced_for_qlora_adds_the_dequantization_time():
    """The reverse: a LoRA figure on the same GPU, model, micro-batch and recomputation, priced for QLoRA, takes the
    dequantization's seconds on top of each micro-batch."""
    from planning.throughput import Plan, scale
    from planning.model_shapes import shape_for_source

    shape = shape_for_source("hub:Qwen/Qwen3-14B")
    lora = Plan(gpu_model="NVIDIA H100 SXM", shape=shape, micro_batch_tokens=16_384, recompute=True)
    qlora = lora.model_copy(update={"qlora": True})
    figure = h100_row().model_copy(update={"method": "lora"})
    assert scale(figure, lora, qlora).tokens_per_second_per_gpu == pytest.approx(
        16_384 / (16_384 / 3000.0 + ROW_DEQUANT_S))
    assert scale(figure, qlora, lora).tokens_per_second_per_gpu == pytest.approx(ROW_WITHOUT_DEQUANT)
    assert scale(figure, qlora, qlora).tokens_per_second_per_gpu == pytest.approx(3000.0)


def test_a_run_only_sharding_holds_is_estimated_too():
    """Llama-3.1-70B LoRA (141 GB in bf16) fits no single H100, so sizing it on one GPU fails; sized over the fewest
    FSDP ranks that hold it, it is compute-bound like the row, recomputing like it: the ratio is the FLOPs per token,
    2 x (decoder linears + LM head): Qwen3-14B 40 x 330,301,440 + 151,936 x 5,120 against Llama-3.1-70B
    80 x 855,638,016 + 128,256 x 8,192; a LoRA run on a bf16 base, so of the row's tokens/s without dequantization."""
    run = dev_run(method="lora", quantization="none", micro_batch_tokens="auto")
    run = run.model_copy(update={"model": run.model.model_copy(update={"source": "hub:meta-llama/Llama-3.1-70B"})})
    estimate = estimate_throughput(run, "NVIDIA H100 SXM", [h100_row()])
    qwen14 = 40 * 330_301_440 + 151_936 * 5_120
    llama70 = 80 * 855_638_016 + 128_256 * 8_192
    assert estimate is not None and estimate.kind == "estimated"
    assert estimate.tokens_per_second_per_gpu == pytest.approx(ROW_WITHOUT_DEQUANT * qwen14 / llama70)
