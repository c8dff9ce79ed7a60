"""The `train` section of a run config: method, adapter, optimizer, batching and the network between ranks."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from documents.sections.strict import Count, Flag, Number, RunPath

Precision = Literal["auto", "bf16", "fp16", "fp32"]
Method = Literal["qlora", "lora", "full"]
Parallelism = Literal["auto", "ddp", "fsdp", "hsdp"]
DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Upper bounds of what a run may ask for: far above any real fine-tune (seed 000: one epoch of 500k rows, batches
# of a few sequences, 8K-token contexts), low enough that a typo (max_steps 10**30) is refused by name, not priced
# at 1e24 GPU-hours. The stack's cost and time ceilings (pipeline.maxRunUsd, maxRunHours) bound the rest.
MAX_STEPS = 10_000_000
MAX_EPOCHS = 1_000
MAX_BATCH = 4_096
MAX_LENGTH = 1_048_576


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_Section):
    """The LoRA adapter trained on top of the frozen (optionally quantized) base."""

    r: Count = Field(16, ge=1, description="adapter rank")
    alpha: Count = Field(32, ge=1, description="scaling numerator (scale = alpha / r)")
    dropout: Number = Field(0.05, ge=0.0, lt=1.0, description="dropout on the adapter input")
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGETS), min_length=1)


class NetworkConfig(_Section):
    """How DDP ranks talk: NCCL over TCP sockets (Ethernet, e.g. L40S nodes) or InfiniBand (H100 fabric)."""

    fabric: Literal["ethernet", "infiniband"] = Field("ethernet", description="inter-node transport for NCCL")
    socket_ifname: str | None = Field(None, description="NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, e.g. eth0")
    ib_hca: str | None = Field(None, description="NCCL_IB_HCA for infiniband, e.g. mlx5")
    debug: Literal["WARN", "INFO", "TRACE"] = Field("WARN", description="NCCL_DEBUG")
    extra_env: dict[str, str] = Field(default_factory=dict, description="more NCCL_* / GLOO_* variables")

    @field_validator("extra_env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not k.replace("_", "").isalnum() or not k.isupper()]
        if bad:
            raise ValueError(f"environment variable names must be UPPER_CASE, got {bad}")
        return value

    def environment(self) -> dict[str, str]:
        """Environment for the training processes on every node."""
        env = {"NCCL_DEBUG": self.debug}
        if self.fabric == "ethernet":
            env["NCCL_IB_DISABLE"] = "1"
        else:
            env["NCCL_IB_DISABLE"] = "0"
            if self.ib_hca:
                env["NCCL_IB_HCA"] = self.ib_hca
        if self.socket_ifname:
            env["NCCL_SOCKET_IFNAME"] = self.socket_ifname
            env["GLOO_SOCKET_IFNAME"] = self.socket_ifname
        return {**env, **self.extra_env}


class TrainConfig(_Section):
    """QLoRA, LoRA or full fine-tuning of the prepared base on the tokenized train split. Paths default to the run
    config's derived locations; relative ones resolve against the run root."""

    model_dir: RunPath | None = Field(None, description="base safetensors folder (default <model_dir>/base)")
    dataset_dir: RunPath | None = Field(None, description="tokenized train folder (default <data_dir>/tokenized/train)")
    eval_dataset_dir: RunPath | None = Field(None, description="tokenized eval folder (default the test split if present)")
    output_dir: RunPath | None = Field(None, description="run records and adapter (default <output_dir>/<name>)")
    checkpoint_dir: RunPath | None = Field(None, description="checkpoints (default <checkpoint_dir>/<name>)")
    method: Method = Field("qlora", description="qlora: a LoRA adapter on a 4/8-bit base; lora: a LoRA adapter on the "
                           "unquantized base; full: every weight trained (fp32 master weights, AdamW)")
    quantization: Literal["4bit", "8bit", "none"] = Field(
        "4bit", description="base weights; follows from method (qlora: 4bit unless 8bit is set; lora, full: none)")
    parallelism: Parallelism = Field(
        "auto", description="ddp: a whole replica per GPU; fsdp: parameters, gradients and optimizer states sharded "
        "over all ranks (full shard by decoder layer); hsdp: fsdp within groups of hsdp_shard_size ranks, each group a "
        "replica of the others (gradients all-reduced across the groups); auto: ddp while a replica fits "
        "memory_fraction of the GPU, else fsdp (auto never picks hsdp)")
    hsdp_shard_size: Count | None = Field(
        None, ge=1, description="hsdp: ranks each replica is sharded over; must divide the world size (default the "
        "ranks per node, torchrun's LOCAL_WORLD_SIZE: shard within a node, replicate across nodes)")
    offload: Literal["auto", "none", "params"] = Field(
        "auto", description="params: FSDP's CPU offload (the shards of weights, gradients and Adam states in host "
        "memory, copied to the GPU layer by layer; the optimizer steps on the CPU); auto: only when nothing else "
        "fits the GPUs the run has; none: never")
    lora: LoraSettings = LoraSettings()
    learning_rate: Number = Field(2e-4, gt=0.0, lt=1.0)
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "cosine"
    warmup_steps: Count = Field(0, ge=0, le=MAX_STEPS)
    weight_decay: Number = Field(0.0, ge=0.0)
    max_grad_norm: Number = Field(1.0, gt=0.0)
    epochs: Number = Field(1.0, gt=0.0, le=MAX_EPOCHS, description="passes over the data; ignored when max_steps is set")
    max_steps: Count | None = Field(None, ge=1, le=MAX_STEPS, description="optimizer steps; overrides epochs")
    micro_batch_size: Count = Field(4, ge=1, le=MAX_BATCH,
                                  description="sequences' worth of tokens per device per forward")
    gradient_accumulation_steps: Count = Field(1, ge=1, le=MAX_BATCH)
    micro_batch_tokens: Count | Literal["auto"] | None = Field(
        None, description="packed micro-batches (batching packed, or auto when it chooses packing): tokens per "
        "micro-batch (every micro-batch has exactly this many); auto: sized from the memory estimate to "
        "memory_fraction of the GPU, keeping micro_batch_size x gradient_accumulation_steps x max_length tokens per "
        "step through accumulation; default micro_batch_size x max_length")
    memory_fraction: Number = Field(0.9, gt=0.0, le=1.0, description="share of GPU memory `auto` sizing may plan for")
    fused_loss: Flag = Field(False, description="fused linear + cross-entropy (Liger, CUDA): no logits tensor")
    kbit_upcast: Flag = Field(
        False, description="4/8-bit base: upcast the frozen norms, embeddings and LM head to fp32 (peft's "
        "prepare_model_for_kbit_training), which makes the residual stream and MLP fp32; off keeps them in the "
        "compute dtype: about half the activation memory and traffic")
    max_length: Count | None = Field(None, ge=16, le=MAX_LENGTH, description="longest sequence (default data.max_length)")
    batching: Literal["auto", "packed", "grouped"] = Field(
        "auto", description="packed: sequences concatenated, attention kept within each; grouped: padded "
        "micro-batches of similar lengths; auto: the one predicted cheaper per real token from the data's lengths"
    )
    precision: Precision = Field(
        "auto", description="auto: bf16 if the GPU has it, else fp16; on CPU bf16 with AVX-512 BF16 or AMX, else fp32")
    gradient_checkpointing: Flag | Literal["auto"] = Field(
        True, description="recompute activations in backward; auto: only when needed to fit (GPU), off on CPU")
    save_steps: Count = Field(50, ge=1, le=MAX_STEPS, description="checkpoint every N optimizer steps")
    save_total_limit: Count = Field(3, ge=1, description="complete checkpoints kept")
    requeue: Flag = Field(True, description="on preemption (USR1) checkpoint and requeue the Slurm job; "
                          "false submits with --no-requeue")
    eval_steps: Count | None = Field(None, ge=1, le=MAX_STEPS, description="evaluate every N steps; none: no evaluation")
    logging_steps: Count = Field(10, ge=1, le=MAX_STEPS)
    seed: Count = Field(42, ge=0)
    dataloader_workers: Count = Field(0, ge=0)
    procs_per_node: Count | None = Field(None, ge=1, description="processes per node (default: GPUs, else 1)")
    network: NetworkConfig = NetworkConfig()

    @model_validator(mode="before")
    @classmethod
    def _method_and_quantization(cls, data: object) -> object:
        """`quantization` follows from `method`; a config that sets only `quantization` (older ones) keeps its
        meaning: none is LoRA, 4bit/8bit QLoRA. A contradiction is refused, naming both fields."""
        if not isinstance(data, dict):
            return data
        method, quantization = data.get("method"), data.get("quantization")
        if method is None:
            method = "lora" if quantization == "none" else "qlora"
        elif method == "qlora" and quantization == "none":
            raise ValueError("method qlora trains on a 4-bit or 8-bit base, but quantization is none: set quantization "
                             "4bit (or 8bit), or method lora")
        elif method in ("lora", "full") and quantization not in (None, "none"):
            raise ValueError(f"method {method} trains an unquantized base, but quantization is {quantization}: drop "
                             "quantization (or set it to none), or use method qlora")
        default = "4bit" if method == "qlora" else "none"
        return {**data, "method": method, "quantization": quantization or default}

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.eval_steps is not None and self.eval_steps % self.save_steps and self.save_steps % self.eval_steps:
            raise ValueError("eval_steps and save_steps must divide one another")
        if self.hsdp_shard_size is not None and self.parallelism != "hsdp":
            raise ValueError(f"train.hsdp_shard_size applies to parallelism hsdp, but parallelism is "
                             f"{self.parallelism}: drop hsdp_shard_size or set parallelism hsdp")
        if self.micro_batch_tokens is not None and self.batching == "grouped":
            raise ValueError("train.micro_batch_tokens sizes packed micro-batches: it needs batching packed or auto "
                             "(under auto it applies when packing is chosen), not grouped")
        return self
