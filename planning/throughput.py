"""The training throughput a stack is priced with when it has not measured its own: the nearest measured figure
scaled from the GPU it was measured on to the stack's GPU (issue 34).

Pure: a run config, a GPU model and the measured figures in; a `TrainingThroughput` with its basis out.

- **measured**: a figure measured by a run on this stack (the caller passes it; never estimated here).
- **borrowed**: a figure for the same GPU model, model and method measured elsewhere (a bench, another stack),
  with the activation recomputation the stack's plan has (the newest such).
- **estimated**: otherwise the nearest figure (same method first, then the closest model size, then the same
  GPU, then the same recomputation, then the newest), scaled by ``ratio = gpu x work``:

  * The measured run is classified by the arithmetic intensity of its decoder GEMMs at its micro-batch
    (``T`` tokens against each ``in x out`` weight, bf16 operands: ``T*in*out / (in*out + T*(in+out))`` FLOP per
    byte, summed over one block) against its GPU's ridge point (peak dense bf16 FLOP/s over memory bandwidth).
  * Compute-bound: ``gpu`` is the ratio of peak dense bf16 FLOP/s, ``work`` the ratio of FLOPs per token
    (``2 x params`` per forward; backward twice that for the inputs only, the base being frozen; one more
    forward with activation recomputation), measured plan over the stack's plan.
  * Memory-bound: ``gpu`` is the ratio of memory bandwidth, ``work`` the ratio of weight bytes read per token
    (passes x bf16 weights / micro-batch tokens).

  The micro-batch and recomputation are the ones the run recorded, else the batch plan of `decide_placement` on
  that GPU's usable memory (what `auto` sizing chooses; sharded over the fewest FSDP ranks that hold a run no
  single GPU does); the stack's side is always that plan on its GPU. A full fine-tune does one more pass per micro-batch
  (the weight gradients) than an adapter on a frozen base.
- **Dequantization** (``DEQUANT_MODEL``): a 4-bit base is dequantized before every GEMM, in every pass. Where the
  figure and the run differ in that (a QLoRA figure for LoRA or full, or the reverse), the figure's dequantization
  time is taken out before scaling and the run's put back: per pass, each decoder linear weight's NF4 bytes and
  absmax read and its bf16 copy written, at the GPU's memory bandwidth. A QLoRA figure scaled to QLoRA keeps its
  share inside the ratio (it scales with bandwidth, not FLOP/s; under 1 % at the bench's micro-batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from documents.run_config import RunConfig
from documents.throughput import ThroughputMeasurement, bench_throughputs
from planning import catalog
from planning.stack import PlanStack
from planning.workers import stack_gpu_model
from planning.model_shapes import ModelShape, UnknownModel, shape_for_source
from planning.placement import Hardware, decide_placement
from planning.batches import DoesNotFit

Kind = Literal["configured", "measured", "borrowed", "estimated"]
Bound = Literal["compute", "memory"]
DEQUANT_BYTES_PER_PARAM = 0.5 + 4 / 64 + 2
"""Memory traffic of dequantizing one NF4 weight: its 4 bits and its share of the fp32 absmax of its 64-value block
read, its bf16 value written (bitsandbytes' dequantize_4bit)."""
DEQUANT_MODEL = (
    "a 4-bit base costs, per micro-batch, passes x decoder linear parameters x 2.5625 B (NF4 read 0.5, fp32 absmax "
    "per 64 values 0.0625, bf16 written 2) at the GPU's datasheet memory bandwidth, not overlapped with the GEMMs; "
    "a lower bound: Lightning-AI/litgpt pull request 275 measured NF4 LoRA 16 % slower than bf16-mixed LoRA "
    "(6,046 s against 5,206 s for 20,000 iterations of small micro-batches), this model counts the bytes only")


class Plan(BaseModel):
    """What one side of the scaling trains with per GPU."""

    model_config = ConfigDict(frozen=True)

    gpu_model: str
    shape: ModelShape
    micro_batch_tokens: int
    recompute: bool
    full: bool = False
    """a full fine-tune: backward also computes every weight's gradient."""
    qlora: bool = False
    """a 4-bit base, dequantized in every pass (``DEQUANT_MODEL``)."""

    @property
    def passes(self) -> int:
        """Forward-sized passes over the weights per micro-batch: forward, backward (input gradients; weight
        gradients too in a full fine-tune), and the recomputed forward."""
        return 2 + int(self.full) + int(self.recompute)

    def flops_per_token(self) -> float:
        return 2.0 * (self.shape.linear_params + self.shape.vocab * self.shape.hidden) * self.passes

    def weight_bytes_per_token(self) -> float:
        return 2.0 * self.shape.linear_params * self.passes / self.micro_batch_tokens

    def dequant_seconds(self) -> float:
        """Time per micro-batch spent dequantizing a 4-bit base (``DEQUANT_MODEL``); 0 without one."""
        if not self.qlora:
            return 0.0
        bandwidth = catalog.gpu_peaks(self.gpu_model).memory_tb_per_s * 1e12
        return self.passes * self.shape.linear_params * DEQUANT_BYTES_PER_PARAM / bandwidth

    def intensity(self) -> float:
        """FLOP per byte of the block's linear layers at this micro-batch (bf16 weights, inputs and outputs)."""
        t = self.micro_batch_tokens
        linears = self.shape.linears().values()
        return sum(t * i * o for i, o in linears) / sum(i * o + t * (i + o) for i, o in linears)


class TrainingThroughput(BaseModel):
    """Training tokens per second per GPU a run is priced with, and what the figure rests on."""

    model_config = ConfigDict(frozen=True)

    tokens_per_second_per_gpu: float
    kind: Kind
    basis: ThroughputMeasurement | None = None
    """the measured figure it is (measured, borrowed) or was scaled from (estimated)."""
    ratio: float = 1.0
    bound: Bound | None = None
    """whether the basis run was compute- or memory-bound (estimated only)."""
    scaling: str = ""
    """how the ratio was made up (estimated only)."""
    read_from: str | None = None
    """the store the measured figure was read from (measured only)."""

    def source(self) -> str:
        """The source line of the training-run cost."""
        if self.kind == "configured":
            return "pricing.training.tokensPerSecondPerGpu"
        assert self.basis is not None
        if self.kind == "estimated":
            return (f"estimated from {self.basis.gpu_model} {self.basis.date}, scaled by {self.ratio:.3g} "
                    f"({self.scaling}): {self.basis.describe()}")
        where = f"; read from {self.read_from}" if self.read_from else ""
        return f"{self.kind}: {self.basis.describe()}{where}"


def _plan(run: RunConfig, shape: ModelShape, gpu_model: str, recorded: ThroughputMeasurement | None = None) -> Plan:
    method = recorded.method if recorded is not None else run.train.method
    full, qlora = method == "full", method == "qlora"
    if recorded is not None and recorded.micro_batch_tokens and recorded.gradient_checkpointing is not None:
        return Plan(gpu_model=gpu_model, shape=shape, micro_batch_tokens=recorded.micro_batch_tokens,
                    recompute=recorded.gradient_checkpointing, full=full, qlora=qlora)
    placement = decide_placement(run, shape, Hardware(gpu_memory_gib=catalog.gpu_memory_gib(gpu_model)))
    if placement is None or placement.batches is None:
        raise DoesNotFit(f"{run.model.source} {run.train.method}: no placement fits {gpu_model}")
    batches = placement.batches
    return Plan(gpu_model=gpu_model, shape=shape, micro_batch_tokens=batches.micro_batch_tokens,
                recompute=batches.gradient_checkpointing, full=full, qlora=qlora)


def _target_plan(run: RunConfig, shape: ModelShape | None, gpu_model: str) -> Plan | None:
    """The stack's side: `run` as `auto` sizing plans it on `gpu_model`; None for an unknown model or GPU, or a run
    that fits nowhere."""
    if shape is None or gpu_model not in catalog.GPU_PEAKS:
        return None
    try:
        return _plan(run, shape, gpu_model)
    except DoesNotFit:
        return None


def _same_recompute(figure: ThroughputMeasurement, target: Plan | None) -> bool:
    """Whether `figure` was measured with the target plan's activation recomputation (or either is not known)."""
    return target is None or figure.gradient_checkpointing is None or figure.gradient_checkpointing == target.recompute


def _shape(source: str) -> ModelShape | None:
    try:
        return shape_for_source(source)
    except UnknownModel:
        return None


def _usable(figure: ThroughputMeasurement) -> bool:
    return figure.device_kind == "gpu" and figure.gpu_model in catalog.GPU_PEAKS


def scale(figure: ThroughputMeasurement, source: Plan, target: Plan) -> TrainingThroughput:
    """`figure` (measured with `source`'s plan) scaled to `target`'s GPU, model and plan."""
    src, dst = catalog.gpu_peaks(source.gpu_model), catalog.gpu_peaks(target.gpu_model)
    bound: Bound = "compute" if source.intensity() >= src.ridge_flop_per_byte else "memory"
    if bound == "compute":
        gpu = dst.bf16_dense_tflops / src.bf16_dense_tflops
        work = source.flops_per_token() / target.flops_per_token()
        parts = f"{dst.bf16_dense_tflops:g}/{src.bf16_dense_tflops:g} dense bf16 TFLOP/s"
    else:
        gpu = dst.memory_tb_per_s / src.memory_tb_per_s
        work = source.weight_bytes_per_token() / target.weight_bytes_per_token()
        parts = f"{dst.memory_tb_per_s:g}/{src.memory_tb_per_s:g} TB/s"
    scaling = (f"{bound}-bound at {source.intensity():,.0f} FLOP/byte against a ridge of "
               f"{src.ridge_flop_per_byte:,.0f}: {parts}" + (f" x work per token {work:.3g}" if work != 1 else ""))
    ratio = gpu * work
    if source.qlora != target.qlora:
        ratio, scaling = _dequantized(figure, source, target, ratio, scaling)
    return TrainingThroughput(tokens_per_second_per_gpu=figure.tokens_per_second_per_device * ratio,
                              kind="estimated", basis=figure, ratio=ratio, bound=bound, scaling=scaling)


def _dequantized(figure: ThroughputMeasurement, source: Plan, target: Plan, ratio: float,
                 scaling: str) -> tuple[float, str]:
    """The ratio with the figure's dequantization taken out before scaling and the target's put back."""
    measured = source.micro_batch_tokens / figure.tokens_per_second_per_device
    core = measured - source.dequant_seconds()
    if core <= 0:
        return ratio, (f"{scaling}; dequantization not separated: the model's {source.dequant_seconds():.3g} s exceeds "
                       f"the measured micro-batch's {measured:.3g} s")
    target_core = target.micro_batch_tokens / (source.micro_batch_tokens / core * ratio)
    seconds = target_core + target.dequant_seconds()
    tokens_per_second = target.micro_batch_tokens / seconds
    which = (f"the figure's {source.dequant_seconds():.3g} s a micro-batch taken out" if source.qlora
             else f"{target.dequant_seconds():.3g} s a micro-batch added")
    return tokens_per_second / figure.tokens_per_second_per_device, f"{scaling}; dequantization: {which}"


def estimate_throughput(run: RunConfig, gpu_model: str, figures: Sequence[ThroughputMeasurement],
                        stack: str | None = None) -> TrainingThroughput | None:
    """Training tokens/s per GPU for `run` on `gpu_model` from measured `figures` (benches, stored runs):
    measured (a run of `stack` on that GPU, model and method), borrowed (the same measured elsewhere) or
    estimated (the nearest figure scaled by the two GPUs' peaks); None when no figure or shape allows it."""
    if run.train is None:
        return None
    model, method = run.model.source, run.train.method
    usable = [f for f in figures if _usable(f)]
    shape = _shape(model)
    target = _target_plan(run, shape, gpu_model)
    same = [f for f in usable if (f.gpu_model, f.model, f.method) == (gpu_model, model, method)]
    own = [f for f in same if stack is not None and f.origin == "run" and f.stack == stack]
    alike = [f for f in same if _same_recompute(f, target)]
    if own or alike:
        newest = max(own or alike, key=lambda f: f.date)
        return TrainingThroughput(tokens_per_second_per_gpu=newest.tokens_per_second_per_device,
                                  kind="measured" if own else "borrowed", basis=newest)
    if shape is None or target is None:
        return None
    shaped = [(f, s) for f in usable if (s := _shape(f.model)) is not None]
    if not shaped:
        return None
    newest_first = sorted(shaped, key=lambda fs: fs[0].date, reverse=True)
    figure, figure_shape = min(newest_first, key=lambda fs: (
        fs[0].method != method, abs(math.log(fs[1].params / shape.params)), fs[0].gpu_model != gpu_model,
        not _same_recompute(fs[0], target)))
    try:
        source = _plan(run, figure_shape, figure.gpu_model, figure)
    except DoesNotFit:
        return None
    scaled = scale(figure, source, target)
    if figure.method != method or figure.model != model:
        also = f"; a {figure.method} figure of {figure.model} for {method} of {model}"
        scaled = scaled.model_copy(update={"scaling": scaled.scaling + also})
    return scaled


def training_throughput(cfg: PlanStack, run: RunConfig, measured: ThroughputMeasurement | None = None,
                        read_from: str | None = None) -> TrainingThroughput | None:
    """The throughput a stack's training run is sized and priced with, and its basis: the stack's
    pricing.training.tokensPerSecondPerGpu, else what a run on the stack `measured` (read from `read_from`), else the
    borrowed or estimated figure (`estimate_throughput`); None on a stack without GPUs."""
    if cfg.pricing.training.tokens_per_second_per_gpu is not None:
        return TrainingThroughput(tokens_per_second_per_gpu=cfg.pricing.training.tokens_per_second_per_gpu,
                                  kind="configured")
    if measured is not None:
        return TrainingThroughput(tokens_per_second_per_gpu=measured.tokens_per_second_per_device,
                                  kind="measured", basis=measured, read_from=read_from)
    gpu = stack_gpu_model(cfg)
    return estimate_throughput(run, gpu, bench_throughputs(), cfg.stack) if gpu else None
