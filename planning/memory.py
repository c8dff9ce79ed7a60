"""Peak GPU memory of one training rank, in bytes: DDP (every GPU holds a full replica) or FSDP (``shards`` ranks).

    total = weights + lora + gradients + optimizer + gathered + activations + max(recompute, logits) + overhead

weights
    ``lora``: every parameter at the weight dtype (bf16 2 B, fp32 4 B). ``full``: fp32 master weights (4 B) under
    mixed precision, the compute dtype's copies counted in ``gathered``.
    ``qlora`` 4-bit NF4: decoder linear weights at 0.5 B/param plus quantization constants, one absmax
    per 64-value block: fp32 (4/64 B/param), or with double quantization an 8-bit absmax (1/64 B/param)
    plus an fp32 absmax per 256 blocks (4/16384 B/param). 8-bit (LLM.int8): 1 B/param plus an fp32
    scale per output row. Embeddings, LM head and norms stay floating point; peft's
    ``prepare_model_for_kbit_training`` upcasts them to fp32 (``kbit_upcast``).
lora
    r x (in + out) per targeted linear per layer, fp32 (peft's default adapter dtype).
gradients
    trainable parameters only: the LoRA parameters (fp32) for lora/qlora, every parameter (fp32 master) for full
    fine-tuning.
optimizer
    AdamW: two states per trainable parameter at the parameter's dtype, fp32 (``torch.optim.AdamW`` allocates
    ``zeros_like(param)``); 8-bit AdamW: 2 x 1 B.
sharding (``shards`` > 1, FSDP full shard by decoder layer)
    weights, lora, gradients and optimizer states are divided by ``shards``; activations are not (each rank
    runs its own micro-batch). With CPU offload (``offload``) those shards live in host memory (``offloaded``)
    and the GPU holds only what is gathered, the activations and the overhead.
gathered
    parameters held unsharded in the compute dtype while they are used. FSDP: the root's own parameters
    (embeddings, LM head, final norm) plus two decoder layers (the one computing and the one prefetched), at
    their stored bytes. DDP full fine-tuning under mixed precision: autocast's compute-dtype copy of every weight,
    kept for backward. Otherwise 0.
activations (saved for backward, per token; ``a`` is the compute dtype's bytes, ``s`` the residual stream's:
    4 under ``kbit_upcast``, whose fp32 norm weights make the stream, norm outputs and MLP fp32, else ``a``)
    per decoder layer: 2 RMSNorms (fp32 copy of the input 4h, fp32 rstd), Qwen3's q/k norms likewise,
    attention's q, k, v and output at ``a`` (k/v expanded to every head: the varlen kernel without native GQA;
    SDPA keeps them grouped) plus an fp32 log-sum-exp per head; ``eager`` adds scores and probabilities
    (2 x heads x seq); SwiGLU: gate, act(gate) and up at ``s`` (3 x intermediate).
    Linear inputs: a frozen (or 4-bit) base linear saves none (its input gradient needs only the weight). A LoRA
    branch saves its input at ``a``, per module (mask 1 B + dropout output) when ``lora_dropout > 0``, once per
    shared input (q/k/v, gate/up) when the input is already at ``a``, and once per module when autocast casts an
    fp32 input; plus the rank-r output. Full fine-tuning saves each distinct linear input at ``a``. o_proj's
    input is the attention output, saved already.
    Measured per saved tensor on CPU (bitsandbytes 4-bit, peft, autocast): tests/test_memory_estimate.py.
    Gradient checkpointing keeps each layer's input (``s`` x h) and, in backward, one layer's recomputed
    activations (``recompute``).
logits
    per token: vocab x (a-byte logits + fp32 log-softmax output, saved for backward + fp32 gradient); the
    fp32 upcast of a < 4-byte logits is not saved (measured on an H100, Qwen3-14B QLoRA, 16,384 tokens).
    With ``fused_loss`` (Liger's fused linear + cross-entropy) no logits are kept: a compute-dtype
    copy of the LM head (vocab x hidden x a) when it is fp32 (``kbit_upcast``) plus, per token, the fp32 gradient of the hidden state and one
    chunk's fp32 logits and gradient (Liger sizes chunks to about tokens x hidden / vocab rows: 2 x 4 x hidden).
    The loss is done before the first layer is recomputed, so the peak holds the larger of ``logits`` and
    ``recompute``, not both.
overhead
    CUDA context, cuBLAS/NCCL workspaces: ``overhead_gib`` (default 1.0), plus ``fragmentation``
    (default 10%) of the dynamic part (gradients, optimizer, activations, the larger of recompute and logits).

Tokens per step = micro_batch x max_length (padding to the longest sequence is the worst case).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from documents.sections.train import TrainConfig
from documents.train_plan import Batching, planned_batching
from planning.model_shapes import ModelShape

if TYPE_CHECKING:
    from documents.run_config import RunConfig

GIB = 1024**3
NF4_BLOCK = 64
DQ_BLOCK = 256
Method = Literal["full", "lora", "qlora"]
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def require_train(run: RunConfig) -> TrainConfig:
    if run.train is None:
        raise ValueError(f"run config {run.name!r}: no 'train' section")
    return run.train


class MemoryInputs(BaseModel):
    """What the estimate needs from a run config's train/data sections."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Method
    quantization: Literal["4bit", "8bit", "none"] = "none"
    double_quant: bool = True
    dtype: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="weights (full/lora) and compute dtype")
    kbit_upcast: bool = Field(False, description="peft prepare_model_for_kbit_training: non-quantized params to fp32")
    lora_r: int = Field(16, gt=0)
    lora_target_modules: tuple[str, ...] = ALL_LINEAR
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    micro_batch: int = Field(1, gt=0)
    max_length: int = Field(2048, gt=0)
    gradient_checkpointing: bool = True
    optimizer: Literal["adamw", "adamw_8bit"] = "adamw"
    attention: Literal["sdpa", "varlen", "eager"] = "sdpa"
    fused_loss: bool = Field(False, description="fused linear + cross-entropy: logits never materialize")
    overhead_gib: float = Field(1.0, ge=0)
    fragmentation: float = Field(0.10, ge=0)
    shards: int = Field(1, ge=1, description="FSDP ranks sharing weights, gradients and optimizer states (1: DDP)")
    offload: bool = Field(False, description="FSDP CPU offload: the shards of weights, gradients and optimizer "
                          "states live in host memory, only the gathered layers on the GPU")


class MemoryEstimate(BaseModel):
    """Bytes per component; ``total`` is the estimated peak of one GPU."""

    model_config = ConfigDict(frozen=True)

    weights: int
    lora: int
    gradients: int
    optimizer: int
    activations: int
    recompute: int
    logits: int
    overhead: int
    trainable_params: int
    gathered: int = 0
    offloaded: int = 0
    """bytes of this rank's shards held in host memory instead (CPU offload), not in ``total``."""

    @property
    def total(self) -> int:
        return (self.weights + self.lora + self.gradients + self.optimizer + self.gathered + self.activations
                + max(self.recompute, self.logits) + self.overhead)

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def fits(self, gpu_memory_gib: float) -> bool:
        return self.total <= gpu_memory_gib * GIB

    def breakdown_gib(self) -> dict[str, float]:
        parts = ("weights", "lora", "gradients", "optimizer", "gathered", "activations", "recompute", "logits",
                 "overhead")
        return {p: round(getattr(self, p) / GIB, 2) for p in parts} | {"total": round(self.total_gib, 2)}


def quantized_weight_bytes(shape: ModelShape, quantization: str, double_quant: bool) -> float:
    """Bytes of the decoder linear weights after bitsandbytes quantization (data + constants)."""
    n = shape.linear_params
    if quantization == "4bit":
        constants = (1 / NF4_BLOCK + 4 / (NF4_BLOCK * DQ_BLOCK)) if double_quant else 4 / NF4_BLOCK
        return n * (0.5 + constants)
    if quantization == "8bit":
        rows = shape.layers * sum(o for _, o in shape.linears().values())
        return n + 4 * rows
    raise ValueError(f"quantization {quantization!r} is not a bitsandbytes quantization")


def weight_bytes(shape: ModelShape, inp: MemoryInputs) -> float:
    """Bytes of every weight as stored (unsharded): fp32 masters for full, the weight dtype for lora, quantized
    linears for qlora."""
    a = DTYPE_BYTES[inp.dtype]
    if inp.method == "full":
        return shape.params * 4
    if inp.method == "lora":
        return shape.params * a
    other = 4 if inp.kbit_upcast else a
    return quantized_weight_bytes(shape, inp.quantization, inp.double_quant) + shape.other_params * other


def lora_params(shape: ModelShape, r: int, targets: tuple[str, ...]) -> int:
    linears = shape.linears()
    unknown = sorted(set(targets) - set(linears))
    if unknown:
        raise ValueError(f"lora target modules {unknown} are not linear layers of this model ({', '.join(linears)})")
    return shape.layers * sum(r * (linears[t][0] + linears[t][1]) for t in targets)


def stream_bytes(inp: MemoryInputs) -> int:
    """Bytes per element of the residual stream, norm outputs and MLP activations."""
    return 4 if inp.method == "qlora" and inp.kbit_upcast else DTYPE_BYTES[inp.dtype]


# Linears by shared input, and whether another op saves that input already (o_proj's is attention's output).
INPUT_GROUPS = ((("q_proj", "k_proj", "v_proj"), False), (("gate_proj", "up_proj"), False), (("down_proj",), False),
                (("o_proj",), True))


def _linear_input_bytes(shape: ModelShape, inp: MemoryInputs) -> float:
    """Bytes per token a layer's linears (base and LoRA branches) save of their inputs."""
    a, s = DTYPE_BYTES[inp.dtype], stream_bytes(inp)
    linears = shape.linears()
    if inp.method == "full":
        return sum(a * linears[group[0]][0] for group, saved_elsewhere in INPUT_GROUPS if not saved_elsewhere)
    total = 0.0
    for group, saved_elsewhere in INPUT_GROUPS:
        fan_in = linears[group[0]][0]
        targeted = sum(1 for t in group if t in inp.lora_target_modules)
        total += targeted * a * inp.lora_r
        if targeted and inp.lora_dropout > 0:
            total += targeted * (1 + a) * fan_in
        elif targeted and not saved_elsewhere:
            total += (1 if s == a else targeted) * a * fan_in
    return total


def layer_activation_bytes_per_token(shape: ModelShape, inp: MemoryInputs) -> float:
    """Bytes one decoder layer saves for backward, per token (see the module docstring)."""
    a, s = DTYPE_BYTES[inp.dtype], stream_bytes(inp)
    h, i = shape.hidden, shape.intermediate
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    total = 2 * (4 * h + 4)                          # two RMSNorms: fp32 input copy, rstd
    if shape.qk_norm:
        total += 4 * (q + kv) + 4 * (shape.heads + shape.kv_heads)
    kv_saved = kv if inp.attention == "sdpa" else q
    total += a * (2 * q + 2 * kv_saved) + 4 * shape.heads  # q, k, v, output; log-sum-exp
    if inp.attention == "eager":
        total += 2 * a * shape.heads * inp.max_length
    total += 3 * s * i                               # SwiGLU: gate, act(gate), up
    return total + _linear_input_bytes(shape, inp)


def estimate(shape: ModelShape, inp: MemoryInputs) -> MemoryEstimate:
    """Peak memory of one training rank; see the module docstring for every term."""
    if inp.method == "qlora" and inp.quantization == "none":
        raise ValueError("method qlora needs quantization 4bit or 8bit")
    a, s = DTYPE_BYTES[inp.dtype], stream_bytes(inp)
    tokens = inp.micro_batch * inp.max_length
    if inp.method == "full":
        trainable, lora = shape.params, 0
    else:
        trainable = lora_params(shape, inp.lora_r, inp.lora_target_modules)
        lora = 4 * trainable
    grad_bytes, state_bytes = 4, 2 if inp.optimizer == "adamw_8bit" else 8
    per_layer = tokens * layer_activation_bytes_per_token(shape, inp)
    if inp.gradient_checkpointing:
        activations, recompute = tokens * shape.layers * s * shape.hidden, per_layer
    else:
        activations, recompute = shape.layers * per_layer, 0
    activations += tokens * (4 * shape.hidden + 4 + a * shape.hidden)  # final norm
    if inp.fused_loss:
        head_copy = shape.vocab * shape.hidden * a if s != a else 0  # an fp32 (upcast) LM head cast for the kernel
        logits = head_copy + tokens * shape.hidden * (4 + 2 * 4)
    else:
        logits = tokens * shape.vocab * (a + 4 + 4)
    n = inp.shards
    weights = weight_bytes(shape, inp) / n
    lora = lora / n
    gradients, optimizer = trainable * grad_bytes / n, trainable * state_bytes / n
    gathered = gathered_bytes(shape, inp)
    offloaded = 0.0
    if inp.offload:
        offloaded = weights + lora + gradients + optimizer
        weights = lora = gradients = optimizer = 0
    dynamic = gradients + optimizer + activations + max(recompute, logits)
    overhead = inp.overhead_gib * GIB + inp.fragmentation * dynamic
    return MemoryEstimate(
        weights=int(weights), lora=int(lora), gradients=int(gradients), optimizer=int(optimizer),
        gathered=int(gathered), activations=int(activations), recompute=int(recompute), logits=int(logits),
        overhead=int(overhead), trainable_params=trainable, offloaded=int(offloaded),
    )


def gathered_bytes(shape: ModelShape, inp: MemoryInputs) -> float:
    """Parameters held unsharded in the compute dtype while in use (see the module docstring)."""
    a = DTYPE_BYTES[inp.dtype]
    if inp.shards == 1:
        return shape.params * a if inp.method == "full" and a < 4 else 0
    root = shape.other_params * (4 if inp.method == "qlora" and inp.kbit_upcast else a)
    if inp.method == "qlora":
        layer = quantized_weight_bytes(shape, inp.quantization, inp.double_quant) / shape.layers
    else:
        layer = shape.linear_params / shape.layers * a
    return root + 2 * layer


def _dtype(name: str) -> str:
    """bf16/fp16/fp32 from a precision name; ``auto`` is bf16, what GPU training picks on L40S/H100."""
    return {"auto": "bf16", "bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(name, name)


def inputs_from_run(run: RunConfig, batching: Batching | None = None, shards: int = 1,
                    offload: bool = False) -> MemoryInputs:
    """MemoryInputs from a RunConfig's ``train`` and ``data`` sections (method, quantization, LoRA); double
    quantization and AdamW as finetune uses them. `batching` is the resolved choice (default: what the configured
    one plans with before the data is read); `shards` the FSDP ranks (1: DDP, see planning.parallelism)."""
    train = require_train(run)
    method = train.method
    targets = ALL_LINEAR if train.lora.target_modules == ["all-linear"] else tuple(train.lora.target_modules)
    return MemoryInputs(
        method=method,
        quantization=train.quantization if method == "qlora" else "none",
        double_quant=True,
        dtype=_dtype(train.precision),
        lora_r=train.lora.r,
        lora_target_modules=tuple(targets),
        lora_dropout=train.lora.dropout,
        micro_batch=train.micro_batch_size,
        max_length=run.max_length,
        gradient_checkpointing=train.gradient_checkpointing is not False,  # auto: planned by planning.batches
        kbit_upcast=train.kbit_upcast,
        optimizer="adamw",
        attention="varlen" if (batching or planned_batching(train.batching)) == "packed" else "sdpa",
        fused_loss=train.fused_loss,
        shards=shards,
        offload=offload,
    )
