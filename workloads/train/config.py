"""Where a training run reads and writes, its precision, and the Hugging Face TrainingArguments its `train`
section (documents.sections.train) produces."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from documents.sections.train import Precision, TrainConfig
from documents.train_plan import Batching, planned_batching
from planning.memory import require_train
from workloads.common.bf16 import cpu_bf16_supported

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from documents.run_config import RunConfig


@dataclass(frozen=True)
class TrainPaths:
    """Absolute locations a training run reads and writes."""

    model_dir: Path
    dataset_dir: Path
    eval_dataset_dir: Path | None
    run_dir: Path
    adapter_dir: Path
    full_model_dir: Path
    checkpoint_dir: Path


def train_paths(run: RunConfig) -> TrainPaths:
    require_train(run)
    paths = run.locate()
    eval_dir = paths.eval_dataset_dir
    return TrainPaths(
        model_dir=paths.train_model_dir,
        dataset_dir=paths.train_dataset_dir,
        eval_dataset_dir=eval_dir if run.train.eval_steps and eval_dir.exists() else None,
        run_dir=paths.train_run_dir,
        adapter_dir=paths.adapter_dir,
        full_model_dir=paths.full_model_dir,
        checkpoint_dir=paths.checkpoints_dir,
    )


def trained_dir(paths: TrainPaths, train: TrainConfig) -> Path:
    """Where the trained result goes: the model folder of a full fine-tune, else the adapter folder."""
    return paths.full_model_dir if train.method == "full" else paths.adapter_dir


def max_length(run: RunConfig) -> int:
    """The run's training sequence limit; the run must have a `train` section."""
    require_train(run)
    return run.max_length


def resolve_precision(precision: Precision, cuda: bool, bf16_supported: bool) -> Literal["bf16", "fp16", "fp32"]:
    """`auto` picks bf16 where the device computes it natively (a GPU that has it; a CPU with AVX-512 BF16 or AMX,
    where oneDNN's bf16 kernels run), fp16 on older GPUs and fp32 on other CPUs; explicit values are checked.
    `bf16_supported`: of the GPU with `cuda`, else of the CPU."""
    if precision == "auto":
        return "bf16" if bf16_supported else "fp16" if cuda else "fp32"
    if precision == "fp16" and not cuda:
        raise ValueError("train.precision: fp16 needs a GPU; use bf16 (on a CPU that has it), fp32 or auto on CPU")
    if precision == "bf16" and not bf16_supported:
        device = "GPU" if cuda else "CPU (no AVX-512 BF16 or AMX)"
        raise ValueError(f"train.precision: bf16 is not supported by this {device}; use {'fp16' if cuda else 'fp32'} "
                         "or auto")
    return precision


def detect_precision(precision: Precision) -> Literal["bf16", "fp16", "fp32"]:
    import torch

    cuda = torch.cuda.is_available()
    return resolve_precision(precision, cuda, torch.cuda.is_bf16_supported() if cuda else cpu_bf16_supported())


FSDP_CONFIG = {"version": 2, "state_dict_type": "SHARDED_STATE_DICT", "reshard_after_forward": True,
               "auto_wrap_policy": "NO_WRAP"}
"""FSDP2 through accelerate: checkpoints in torch.distributed.checkpoint's sharded format (each rank writes its
shards; loading reshards). The model arrives already sharded (workloads/train/sharding.py)."""


def create_training_arguments(
    train: TrainConfig, checkpoint_dir: Path, precision: Literal["bf16", "fp16", "fp32"], report_eval: bool = False,
    gradient_accumulation_steps: int | None = None, batching: Batching | None = None, fsdp: bool = False,
) -> TrainingArguments:
    """TrainingArguments for `train` (`gradient_accumulation_steps` overrides the configured one, e.g. from a
    batch plan; `batching` is the resolved choice, by default what `auto` plans with before reading the data;
    `fsdp` the parallelism plan's strategy).
    Checkpoints are saved under `checkpoint_dir` and pruned by this package (atomic, bounded), so the Trainer's own
    rotation is off. Activation checkpointing is switched on by `finetune.load_model` on the model itself, not
    through TrainingArguments (whose argument for it was renamed in transformers 5.23)."""
    import torch
    from transformers import TrainingArguments

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    packed = (batching or planned_batching(train.batching)) == "packed"
    return TrainingArguments(
        output_dir=str(checkpoint_dir),
        per_device_train_batch_size=1 if packed else train.micro_batch_size,
        per_device_eval_batch_size=1 if packed else train.micro_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps or train.gradient_accumulation_steps,
        learning_rate=train.learning_rate,
        lr_scheduler_type=train.lr_scheduler,
        warmup_steps=train.warmup_steps,
        weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm,
        num_train_epochs=train.epochs,
        max_steps=train.max_steps or -1,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        save_strategy="steps",
        save_steps=train.save_steps,
        save_total_limit=None,
        eval_strategy="steps" if report_eval else "no",
        eval_steps=train.eval_steps if report_eval else None,
        logging_strategy="steps",
        logging_steps=train.logging_steps,
        logging_first_step=True,
        seed=train.seed,
        data_seed=train.seed,
        dataloader_num_workers=train.dataloader_workers,
        ddp_backend=("nccl" if torch.cuda.is_available() else "gloo") if distributed else None,
        ddp_find_unused_parameters=False,
        fsdp=fsdp,
        fsdp_config=dict(FSDP_CONFIG) if fsdp else None,
        remove_unused_columns=False,
        train_sampling_strategy="random" if packed else "group_by_length",
        length_column_name="length",
        report_to="none",
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )
