"""QLoRA, LoRA or full fine-tuning of the prepared base on the tokenized train split (assistant-only labels).

    python -m workloads.train.finetune --config RUN.json                      # one process
    torchrun --nproc_per_node N -m workloads.train.finetune --config RUN.json  # DDP, FSDP or HSDP (gloo/CPU, NCCL/GPU)

DDP, FSDP or HSDP comes from workloads.train.parallelism. Resumes from the newest intact checkpoint; SIGTERM, SIGUSR1
or the file named by FT_STOP_FILE make every rank checkpoint at the same step and exit with code 75. Writes the
adapter (or, for a full fine-tune, the model folder), metrics.jsonl, loss.png and run_manifest.json under the
run's output folder.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    PrinterCallback,
    Trainer,
    set_seed,
)

from documents.atomic import atomic_dir
from documents.hf_files import MODEL_CONFIG
from documents.metrics import METRICS_NAME, truncate_metrics
from documents.run_config import ConfigError, RunConfig, load_run_config
from documents.run_manifest import (
    RUN_MANIFEST_NAME,
    RunManifest,
    config_hash,
    dataset_hash,
    finish_attempt,
    git_commit,
    load_run_manifest,
    model_hash,
    package_versions,
    start_attempt,
    training_fingerprint,
)
from documents.sections.train import TrainConfig
from documents.train_plan import Batching, BatchingDecision, BatchPlan, planned_batching
from workloads.common.job_metrics import JobMetricsFile
from workloads.train import attention, checkpoints, fused_loss, sharded_save, sharding
from workloads.train.batch_choice import decide_batching
from workloads.train.batching import REAL_TOKENS, PackedCollator, PackedDataset, PaddedCollator, batch_tokens
from workloads.train.config import (
    TrainPaths,
    create_training_arguments,
    detect_precision,
    max_length,
    require_train,
    train_paths,
    trained_dir,
)
from workloads.train.loss_chart import plot_loss
from workloads.train.metrics_callback import MetricsCallback, TokenCounter
from workloads.train.model_shapes import ModelShape, shape_from_model_folder
from workloads.train.parallelism import BadShardSize
from workloads.train.placement import Hardware, Placement, decide_placement
from workloads.train.preemption import INTERRUPTED_EXIT, STOP_FILE_ENV, PreemptionCallback, StopRequest
from workloads.train.sizing import DoesNotFit, plan_batches

log = logging.getLogger("workloads.train.finetune")

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PLOT = "loss.png"


class FinetuneTrainer(Trainer):
    """Trainer that counts real vs processed tokens and saves checkpoints atomically with a bounded history."""

    def __init__(self, *args: Any, counter: TokenCounter, keep: int, fingerprint: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counter = counter
        self.keep = keep
        self.fingerprint = fingerprint

    def create_accelerator_and_postprocess(self) -> None:
        """Under FSDP on CPU accelerate (1.15) falls back to DDP (its FSDP path is for accelerators only); the
        model arrives sharded already, so only accelerate's FSDP state is set, which the checkpointing reads."""
        super().create_accelerator_and_postprocess()
        if self.args.fsdp_plugin_args is not None and not self.is_fsdp_enabled:
            from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

            state = self.accelerator.state
            state.distributed_type = DistributedType.FSDP
            state.fsdp_plugin = FullyShardedDataParallelPlugin(**self.args.fsdp_plugin_args)
            self.is_fsdp_enabled = True

    def training_step(self, model, inputs, num_items_in_batch=None):  # noqa: ANN001, ANN201 - Trainer signature
        self.counter.add(*batch_tokens(inputs))
        return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
        inputs.pop(REAL_TOKENS, None)
        return super().compute_loss(model, inputs, *args, **kwargs)

    def _save_checkpoint(self, model, trial) -> None:  # noqa: ANN001
        root = Path(self.args.output_dir)
        step = self.state.global_step
        staging = root / f"{checkpoints.STAGING}{step}"
        if self.args.should_save:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        self.args.output_dir = str(staging)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.output_dir = str(root)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            target = checkpoints.publish(staging / f"{checkpoints.PREFIX}{step}", root, step, self.fingerprint)
            checkpoints.prune(root, self.keep, self.fingerprint)
            log.info("checkpoint %s saved", target)
        self.accelerator.wait_for_everyone()


def load_model(model_dir: Path, train: TrainConfig, precision: str, local_rank: int,
               choice: attention.AttentionChoice, checkpointing: bool, fsdp: bool = False) -> Any:
    """Base model (NF4 4-bit, int8 or unquantized) with the chosen attention, its frozen floating-point weights
    in the compute dtype (or fp32 under `train.kbit_upcast`), activation checkpointing when asked, the fused loss
    when configured, and a fresh LoRA adapter; for method full every weight in fp32 (master weights; the
    Trainer's autocast, or FSDP's mixed precision policy, computes in the compute dtype) and no adapter. Under
    `fsdp` an unquantized base is loaded into CPU memory by rank 0 only, not onto the GPU (a replica that does not
    fit the GPU is why FSDP was chosen), and built on the meta device (no bytes) by every other rank:
    `sharding.shard_from_rank0` fills the shards from rank 0. A 4-bit base still loads on every rank onto its GPU,
    where bitsandbytes quantizes it and keeps its quantization state."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    dtype = torch.float32 if train.method == "full" else DTYPES[precision]
    quantization = None
    if train.quantization == "4bit":
        quantization = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=dtype,
        )
    elif train.quantization == "8bit":
        quantization = BitsAndBytesConfig(load_in_8bit=True)
    cuda = torch.cuda.is_available()
    if choice.implementation == attention.VARLEN:
        attention.register()
    if fsdp and quantization is None and int(os.environ.get("RANK", "0")) != 0:
        config = AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=choice.implementation)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=dtype, quantization_config=quantization, attn_implementation=choice.implementation,
            device_map={"": local_rank} if cuda and not (fsdp and quantization is None) else None,
        )
    model.config.use_cache = False
    if quantization is not None and train.kbit_upcast:
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    elif checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    if train.fused_loss:
        fused_loss.enable(model)
    if train.method == "full":
        return model
    lora = LoraConfig(
        r=train.lora.r, lora_alpha=train.lora.alpha, lora_dropout=train.lora.dropout,
        target_modules=train.lora.target_modules, task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def read_tokenized(folder: Path) -> Any:
    """A tokenized split (input_ids, attention_mask, labels, length), checked."""
    from datasets import load_from_disk

    if not (folder / "dataset_info.json").is_file():
        raise FileNotFoundError(f"{folder}: not a tokenized dataset folder (run the prepare stage first)")
    data = load_from_disk(str(folder))
    missing = {"input_ids", "attention_mask", "labels", "length"} - set(data.column_names)
    if missing:
        raise ValueError(f"{folder}: tokenized dataset lacks columns {sorted(missing)}")
    return data


def load_datasets(paths: TrainPaths, train: TrainConfig, length: int, tokenizer: Any,
                  plan: BatchPlan, batching: Batching) -> tuple[Any, Any, Any]:
    """Train and optional eval datasets with their collator: packed micro-batches of exactly
    `plan.micro_batch_tokens` tokens, or length-grouped."""
    rows = read_tokenized(paths.dataset_dir)
    eval_rows = read_tokenized(paths.eval_dataset_dir) if paths.eval_dataset_dir else None
    if batching == "packed":
        budget = plan.micro_batch_tokens
        packed = PackedDataset(rows, budget, length, train.seed)
        evals = PackedDataset(eval_rows, budget, length, train.seed) if eval_rows is not None else None
        log.info("packed %d sequences into %d micro-batches of %d tokens", len(rows), len(packed), budget)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return packed, evals, PackedCollator(budget, pad or 0)
    return rows, eval_rows, PaddedCollator(tokenizer)


def choose_batching(run: RunConfig, dataset_dir: Path, plan: BatchPlan) -> BatchingDecision:
    """The run's batching, decided from the train split's lengths (workloads/train/batch_choice.py)."""
    train = require_train(run)
    lengths = read_tokenized(dataset_dir)["length"] if train.batching == "auto" else None
    return decide_batching(train.batching, lengths, micro_batch_size=train.micro_batch_size,
                           accumulation=train.gradient_accumulation_steps, max_length=max_length(run),
                           token_budget=plan.micro_batch_tokens, seed=train.seed, cuda=torch.cuda.is_available())


def gpu_memory_gib() -> float | None:
    """Total memory of this process's GPU (None on CPU)."""
    if not torch.cuda.is_available():
        return None
    index = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.cuda.get_device_properties(index).total_memory / 2**30


def job_placement(run: RunConfig, model_dir: Path, batching: Batching | None = None) -> Placement:
    """The placement this job trains with: `decide_placement` over the nodes torchrun started (WORLD_SIZE ranks,
    LOCAL_WORLD_SIZE per node) on this GPU's memory as PyTorch reports it and this node's RAM."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    hardware = Hardware(gpu_memory_gib=gpu_memory_gib(), gpus_per_node=per_node, host_memory_gib=ram)
    placement = decide_placement(run, model_shape(model_dir), hardware, max(1, world // per_node), batching)
    assert placement is not None  # a given node count always yields a placement
    return placement


def _batches(placement: Placement) -> BatchPlan:
    if placement.batches is None:
        raise DoesNotFit(placement.why_not)
    return placement.batches


def model_shape(model_dir: Path) -> ModelShape:
    if not (model_dir / MODEL_CONFIG).is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json (run the prepare stage first)")
    return shape_from_model_folder(model_dir)


def batch_plan(run: RunConfig, model_dir: Path, batching: Batching | None = None, shards: int = 1) -> BatchPlan:
    """Micro-batch tokens, accumulation and checkpointing for this machine (see workloads.train.sizing)."""
    return plan_batches(run, model_shape(model_dir), gpu_memory_gib(), batching, shards)


def is_done(manifest_file: Path, output: Path, digest: str) -> bool:
    manifest = load_run_manifest(manifest_file)
    saved = any(output.glob("*.safetensors"))
    return manifest is not None and manifest.status == "completed" and manifest.config_sha256 == digest and saved


def save_result(trainer: Trainer, tokenizer: Any, folder: Path, fsdp: bool, rank0: bool) -> int | None:
    """The adapter in PEFT's layout, or a full fine-tune's model folder, written by rank 0 (atomic). Under FSDP no
    rank gathers the model (workloads/train/sharded_save.py): an adapter gathers its trainable weights only, a full
    fine-tune streams its weights into the folder's files; returns the most gathered bytes rank 0 held (None
    without FSDP)."""
    model = trainer.model
    if not fsdp:
        if rank0:
            with atomic_dir(folder) as tmp:
                model.save_pretrained(tmp, safe_serialization=True)
                tokenizer.save_pretrained(tmp)
        return None
    if hasattr(model, "get_base_model"):  # a PEFT adapter
        state, held = sharded_save.gather_trainable(model, rank0)
        if rank0:
            with atomic_dir(folder) as tmp:
                model.save_pretrained(tmp, safe_serialization=True, state_dict=state)
                tokenizer.save_pretrained(tmp)
        return held
    shard_bytes = int(os.environ.get(sharded_save.SHARD_BYTES_ENV, sharded_save.DEFAULT_SHARD_BYTES))
    if not rank0:
        return sharded_save.stream_full_model(model, None, shard_bytes)
    with atomic_dir(folder) as tmp:
        held = sharded_save.stream_full_model(model, tmp, shard_bytes)
        model.config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return held


def train_run(run: RunConfig) -> int:
    """Train (or resume) the run; returns 0 when complete, 75 when stopped early with a checkpoint saved."""
    train = require_train(run)
    paths = train_paths(run)
    digest = config_hash(run.model_dump(mode="json"))
    fingerprint = training_fingerprint(run.model_dump(mode="json"))
    manifest_file = paths.run_dir / RUN_MANIFEST_NAME
    output = trained_dir(paths, train)
    if is_done(manifest_file, output, digest):
        log.info("%s: this config already trained to completion; nothing to do", paths.run_dir)
        return 0
    precision = detect_precision(train.precision)
    stop = StopRequest(os.environ.get(STOP_FILE_ENV))
    placement = job_placement(run, paths.model_dir)
    parallel = placement.plan
    if not parallel.fits:
        log.warning("the memory estimate says this run does not fit: %s", parallel.reason)
    fsdp = parallel.strategy in ("fsdp", "hsdp")
    plan = _batches(placement)
    batching = choose_batching(run, paths.dataset_dir, plan)
    if batching.chosen != planned_batching(train.batching):
        plan = _batches(job_placement(run, paths.model_dir, batching.chosen))
    choice = attention.choose(torch.cuda.is_available(), batching.chosen == "packed")
    args = create_training_arguments(train, paths.checkpoint_dir, precision, report_eval=bool(paths.eval_dataset_dir),
                                     gradient_accumulation_steps=plan.gradient_accumulation_steps,
                                     batching=batching.chosen, fsdp=fsdp)
    rank0 = args.process_index == 0
    resume = checkpoints.latest_complete(paths.checkpoint_dir, fingerprint)
    resumed_step = checkpoints.checkpoint_step(resume) if resume else 0
    note = checkpoints.check_resumable(resume, parallel.strategy, args.world_size) if resume else None
    if note:
        log.warning(note)
    tokenizer = AutoTokenizer.from_pretrained(paths.model_dir)
    set_seed(train.seed)  # every rank draws the same fresh adapter: FSDP shards each rank's own copy, DDP broadcasts rank 0's
    model = load_model(paths.model_dir, train, precision, args.local_process_index, choice, plan.gradient_checkpointing,
                       fsdp)
    offload, cuda = parallel.offload == "params", torch.cuda.is_available()
    mesh = sharding.hsdp_mesh(parallel.replicas, parallel.shards, cuda) if parallel.strategy == "hsdp" else None
    if fsdp and train.quantization == "none":
        sharding.shard_from_rank0(model, DTYPES[precision], cuda, offload, mesh)
    elif fsdp:
        sharding.shard(model, DTYPES[precision], cuda, offload, mesh)
    if rank0 and train.method != "full":
        model.print_trainable_parameters()
    metrics_file = paths.run_dir / METRICS_NAME
    manifest: RunManifest | None = None
    if rank0:
        paths.run_dir.mkdir(parents=True, exist_ok=True)
        truncate_metrics(metrics_file, resumed_step or 0)
        base = {
            "run": run.name,
            "config_sha256": digest,
            "config": run.model_dump(mode="json"),
            "precision": precision,
            "dataset": dataset_hash(paths.dataset_dir),
            "base_model": model_hash(paths.model_dir),
            "packages": package_versions(),
            "git_commit": git_commit(Path(__file__).resolve().parents[2]),
            "world_size": args.world_size,
            "nodes": int(os.environ.get("SLURM_NNODES", "1")),
            "attention": choice.model_dump(),
            "batch_plan": plan.model_dump(),
            "batching": batching.model_dump(),
            "parallelism": parallel.model_dump(),
            "parameter_bytes": {"frozen": sharding.local_parameter_bytes(model, trainable=False),
                                "trainable": sharding.local_parameter_bytes(model, trainable=True)},
            "fused_loss": train.fused_loss,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "device_kind": "gpu" if torch.cuda.is_available() else "cpu",
        }
        manifest = start_attempt(manifest_file, base, resumed_step or 0)
    log.info("rank %d/%d precision=%s resume=%s attention=%s/%s plan=%s batching=%s (%s) parallelism=%s (%s)",
             args.process_index, args.world_size, precision, resume or "none", choice.implementation, choice.backend,
             plan.model_dump(), batching.chosen, batching.reason, parallel.strategy, parallel.reason)

    train_data, eval_data, collator = load_datasets(paths, train, max_length(run), tokenizer, plan, batching.chosen)
    counter = TokenCounter()
    preemption = PreemptionCallback(stop)
    trainer = FinetuneTrainer(
        model=model, args=args, train_dataset=train_data, eval_dataset=eval_data, data_collator=collator,
        callbacks=[MetricsCallback(metrics_file, counter, JobMetricsFile.from_env("train", run.name) if rank0 else None),
                   preemption], counter=counter, keep=train.save_total_limit,
        fingerprint=fingerprint,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    step = trainer.state.global_step
    if preemption.stopped_at is not None:
        if rank0:
            finish_attempt(manifest_file, manifest, "interrupted", step)
            plot_loss(metrics_file, paths.run_dir / PLOT)
        log.warning("stopped at step %d with a checkpoint; rerun (or requeue) to resume", step)
        return INTERRUPTED_EXIT
    export_peak = save_result(trainer, tokenizer, output, fsdp, rank0)
    if rank0:
        plot_loss(metrics_file, paths.run_dir / PLOT)
        kind = "model" if train.method == "full" else "adapter"
        finish_attempt(manifest_file, manifest, "completed", step, export_peak_bytes=export_peak, **{kind: str(output)})
        log.info("%s saved to %s", kind, output)
    trainer.accelerator.wait_for_everyone()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="run config JSON (uses its 'train' section)")
    options = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO if rank == "0" else logging.WARNING,
                        format=f"%(asctime)s [rank {rank}] %(name)s %(levelname)s: %(message)s")
    try:
        run = load_run_config(options.config)
        require_train(run)
    except (ConfigError, ValueError) as error:
        print(f"finetune: {error}", file=sys.stderr)
        return 2
    try:
        return train_run(run)
    except (checkpoints.CannotResume, BadShardSize) as error:
        print(f"finetune: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
