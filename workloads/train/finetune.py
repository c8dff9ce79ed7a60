"""QLoRA, LoRA or full fine-tuning of the prepared base on the tokenized train split (assistant-only labels).

    python -m workloads.train.finetune --config RUN.json                      # one process
    torchrun --nproc_per_node N -m workloads.train.finetune --config RUN.json  # DDP, FSDP or HSDP (gloo/CPU, NCCL/GPU)

DDP, FSDP or HSDP comes from planning.parallelism. Resumes from the newest intact checkpoint; SIGTERM, SIGUSR1
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

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
from documents.run_plan import RunPlan
from documents.sections.train import TrainConfig
from documents.train_plan import (AttentionChoice, Batching, BatchingDecision, BatchPlan, ParallelismPlan,
                                  planned_batching)
from workloads.common.job_metrics import JobMetricsFile
from workloads.train import attention, checkpoints, fused_loss, label_loss, sharded_save, sharding
from workloads.train.batch_choice import decide_batching
from workloads.train.batching import REAL_TOKENS, PackedCollator, PackedDataset, PaddedCollator, batch_tokens
from workloads.train.config import (
    TrainPaths,
    create_training_arguments,
    detect_precision,
    max_length,
    train_paths,
    trained_dir,
)
from workloads.train.loss_chart import plot_loss
from workloads.train.metrics_callback import MetricsCallback, TokenCounter
from workloads.train.preemption import INTERRUPTED_EXIT, STOP_FILE_ENV, PreemptionCallback, StopRequest, any_rank
from planning.batches import DoesNotFit, plan_batches
from planning.memory import require_train
from planning.model_shapes import ModelShape, shape_from_model_folder
from planning.parallelism import BadShardSize
from planning.job_check import checked_placement
from planning.placement import Placement
from workloads.train.run_plan import gpu_memory_gib, job_hardware, submitted_plan

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
        failure: Exception | None = None
        try:
            super()._save_checkpoint(model, trial)
        except Exception as error:  # noqa: BLE001 - a full disk: OSError, SafetensorError or torch's RuntimeError
            failure = error
        finally:
            self.args.output_dir = str(root)
        self._all_saved(root, step, failure)
        if self.args.should_save:
            try:
                target = checkpoints.publish(staging / f"{checkpoints.PREFIX}{step}", root, step, self.fingerprint)
                checkpoints.prune(root, self.keep, self.fingerprint)
                log.info("checkpoint %s saved", target)
            except OSError as error:
                failure = error
        self._all_saved(root, step, failure)

    def _all_saved(self, root: Path, step: int, failure: Exception | None) -> None:
        """Return when every rank's part of checkpoint-<step> is written; else, on every rank, remove the staging
        folder and raise SaveFailed (the previous checkpoints stay)."""
        if not any_rank(failure is not None):
            return
        error = checkpoints.save_failure(root, step, failure)
        if self.args.should_save:
            shutil.rmtree(root / f"{checkpoints.STAGING}{step}", ignore_errors=True)
        raise error from failure


def load_model(model_dir: Path, train: TrainConfig, precision: str, local_rank: int,
               choice: attention.AttentionChoice, checkpointing: bool, fsdp: bool = False) -> Any:
    """Base model (NF4 4-bit, int8 or unquantized) with the chosen attention, its frozen floating-point weights
    in the compute dtype (or fp32 under `train.kbit_upcast`), activation checkpointing when asked, the training
    loss at labelled positions only (through Liger's fused kernel when configured), and a fresh LoRA adapter; for
    method full every weight in fp32 (master weights; the Trainer's autocast, or FSDP's mixed precision policy,
    computes in the compute dtype) and no adapter. Under
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
    else:
        label_loss.enable(model)
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


def job_placement(run: RunConfig, model_dir: Path, batching: Batching | None = None,
                  run_plan: RunPlan | None = None) -> tuple[Placement, list[str]]:
    """The placement this job trains with and how it differs from its plan (`run_plan`, else the one it was
    submitted with, else one it makes: workloads/train/run_plan.py): the plan's placement checked against the nodes
    torchrun started (WORLD_SIZE ranks, LOCAL_WORLD_SIZE per node), this GPU's memory as PyTorch reports it and this
    node's RAM (planning.job_check); PlanMismatch, naming both figures, where it cannot train as planned."""
    got, shape = job_hardware(), model_shape(model_dir)
    plan = run_plan or submitted_plan(run, shape, got)
    return checked_placement(run, shape, plan.training, got, batching)


def _batches(placement: Placement) -> BatchPlan:
    if placement.batches is None:
        raise DoesNotFit(placement.why_not)
    return placement.batches


def model_shape(model_dir: Path) -> ModelShape:
    if not (model_dir / MODEL_CONFIG).is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json (run the prepare stage first)")
    return shape_from_model_folder(model_dir)


def batch_plan(run: RunConfig, model_dir: Path, batching: Batching | None = None, shards: int = 1) -> BatchPlan:
    """Micro-batch tokens, accumulation and checkpointing for this machine (see planning.batches)."""
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


@dataclass(frozen=True)
class RunSetup:
    """What `decide` settles before anything loads: the precision, where the run trains and how it batches."""

    precision: str
    placement: Placement
    plan: BatchPlan
    batching: BatchingDecision
    attention: AttentionChoice
    run_plan: RunPlan
    """the plan the run was submitted with (or made itself), recorded in the run manifest."""
    plan_differences: list[str]
    """where the job adapted the plan to what it got (planning.job_check)."""

    @property
    def parallel(self) -> ParallelismPlan:
        return self.placement.plan

    @property
    def fsdp(self) -> bool:
        return self.parallel.strategy in ("fsdp", "hsdp")


def decide(run: RunConfig, paths: TrainPaths) -> RunSetup:
    """Precision, placement (parallelism and batch plan from the memory estimate), batching from the data (the plan
    made again when the data chooses another batching) and the attention backend."""
    train = require_train(run)
    precision = detect_precision(train.precision)
    run_plan = submitted_plan(run, model_shape(paths.model_dir), job_hardware())
    placement, differences = job_placement(run, paths.model_dir, run_plan=run_plan)
    if not placement.plan.fits:
        log.warning("the memory estimate says this run does not fit: %s", placement.plan.reason)
    plan = _batches(placement)
    batching = choose_batching(run, paths.dataset_dir, plan)
    if batching.chosen != planned_batching(train.batching):
        replanned, differences = job_placement(run, paths.model_dir, batching.chosen, run_plan)
        plan = _batches(replanned)
    for difference in differences:
        log.warning("the plan adapted to this job: %s", difference)
    choice = attention.choose(torch.cuda.is_available(), batching.chosen == "packed")
    return RunSetup(precision=precision, placement=placement, plan=plan, batching=batching, attention=choice,
                    run_plan=run_plan, plan_differences=differences)


def resume_point(paths: TrainPaths, fingerprint: str, setup: RunSetup, world_size: int) -> tuple[Path | None, int]:
    """The newest intact checkpoint of this training (None: a fresh start) and its step."""
    resume = checkpoints.latest_complete(paths.checkpoint_dir, fingerprint)
    note = checkpoints.check_resumable(resume, setup.parallel.strategy, world_size) if resume else None
    if note:
        log.warning(note)
    return resume, checkpoints.checkpoint_step(resume) if resume else 0


def load_and_shard(run: RunConfig, paths: TrainPaths, setup: RunSetup, local_rank: int, rank0: bool) -> Any:
    """The base with its adapter (or the whole model), sharded by FSDP or HSDP where the plan says so."""
    train = require_train(run)
    set_seed(train.seed)  # every rank draws the same fresh adapter: FSDP shards each rank's own copy, DDP broadcasts rank 0's
    model = load_model(paths.model_dir, train, setup.precision, local_rank, setup.attention,
                       setup.plan.gradient_checkpointing, setup.fsdp)
    parallel, cuda = setup.parallel, torch.cuda.is_available()
    offload = parallel.offload == "params"
    mesh = sharding.hsdp_mesh(parallel.replicas, parallel.shards, cuda) if parallel.strategy == "hsdp" else None
    if setup.fsdp and train.quantization == "none":
        sharding.shard_from_rank0(model, DTYPES[setup.precision], cuda, offload, mesh)
    elif setup.fsdp:
        sharding.shard(model, DTYPES[setup.precision], cuda, offload, mesh)
    if rank0 and train.method != "full":
        model.print_trainable_parameters()
    return model


def start_manifest(run: RunConfig, paths: TrainPaths, setup: RunSetup, args: Any, model: Any, digest: str,
                   resumed_step: int) -> RunManifest:
    """Rank 0: the metrics cut back to the resumed step and this attempt recorded in the run manifest."""
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    truncate_metrics(paths.run_dir / METRICS_NAME, resumed_step)
    cuda = torch.cuda.is_available()
    base = {
        "run": run.name,
        "config_sha256": digest,
        "config": run.model_dump(mode="json"),
        "precision": setup.precision,
        "dataset": dataset_hash(paths.dataset_dir),
        "base_model": model_hash(paths.model_dir),
        "packages": package_versions(),
        "git_commit": git_commit(Path(__file__).resolve().parents[2]),
        "world_size": args.world_size,
        "nodes": int(os.environ.get("SLURM_NNODES", "1")),
        "attention": setup.attention.model_dump(),
        "batch_plan": setup.plan.model_dump(),
        "batching": setup.batching.model_dump(),
        "parallelism": setup.parallel.model_dump(),
        "plan": setup.run_plan.model_dump(mode="json"),
        "plan_differences": setup.plan_differences,
        "parameter_bytes": {"frozen": sharding.local_parameter_bytes(model, trainable=False),
                            "trainable": sharding.local_parameter_bytes(model, trainable=True)},
        "fused_loss": require_train(run).fused_loss,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "device_kind": "gpu" if cuda else "cpu",
    }
    return start_attempt(paths.run_dir / RUN_MANIFEST_NAME, base, resumed_step)


def build_trainer(run: RunConfig, paths: TrainPaths, setup: RunSetup, args: Any, model: Any, tokenizer: Any,
                  fingerprint: str, stop: StopRequest) -> tuple[FinetuneTrainer, PreemptionCallback]:
    """The trainer over the tokenized splits, with the metrics and preemption callbacks."""
    train = require_train(run)
    train_data, eval_data, collator = load_datasets(paths, train, max_length(run), tokenizer, setup.plan,
                                                    setup.batching.chosen)
    counter, preemption = TokenCounter(), PreemptionCallback(stop)
    job_metrics = JobMetricsFile.from_env("train", run.name) if args.process_index == 0 else None
    trainer = FinetuneTrainer(
        model=model, args=args, train_dataset=train_data, eval_dataset=eval_data, data_collator=collator,
        callbacks=[MetricsCallback(paths.run_dir / METRICS_NAME, counter, job_metrics), preemption],
        counter=counter, keep=train.save_total_limit, fingerprint=fingerprint,
    )
    trainer.remove_callback(PrinterCallback)
    return trainer, preemption


def finish(run: RunConfig, paths: TrainPaths, trainer: FinetuneTrainer, preemption: PreemptionCallback,
           tokenizer: Any, setup: RunSetup, manifest: RunManifest | None, rank0: bool) -> int:
    """After training: the stopped attempt recorded (exit 75, resume later), else the result exported and the
    attempt completed."""
    step, metrics_file = trainer.state.global_step, paths.run_dir / METRICS_NAME
    manifest_file = paths.run_dir / RUN_MANIFEST_NAME
    if preemption.stopped_at is not None:
        if rank0:
            finish_attempt(manifest_file, manifest, "interrupted", step)
            plot_loss(metrics_file, paths.run_dir / PLOT)
        log.warning("stopped at step %d with a checkpoint; rerun (or requeue) to resume", step)
        return INTERRUPTED_EXIT
    train = require_train(run)
    output = trained_dir(paths, train)
    export_peak = save_result(trainer, tokenizer, output, setup.fsdp, rank0)
    if rank0:
        plot_loss(metrics_file, paths.run_dir / PLOT)
        kind = "model" if train.method == "full" else "adapter"
        finish_attempt(manifest_file, manifest, "completed", step, export_peak_bytes=export_peak, **{kind: str(output)})
        log.info("%s saved to %s", kind, output)
    trainer.accelerator.wait_for_everyone()
    return 0


def train_run(run: RunConfig) -> int:
    """Train (or resume) the run; returns 0 when complete, 75 when stopped early with a checkpoint saved."""
    train, paths = require_train(run), train_paths(run)
    digest = config_hash(run.model_dump(mode="json"))
    fingerprint = training_fingerprint(run.model_dump(mode="json"))
    if is_done(paths.run_dir / RUN_MANIFEST_NAME, trained_dir(paths, train), digest):
        log.info("%s: this config already trained to completion; nothing to do", paths.run_dir)
        return 0
    setup = decide(run, paths)
    stop = StopRequest(os.environ.get(STOP_FILE_ENV))
    args = create_training_arguments(train, paths.checkpoint_dir, setup.precision,
                                     report_eval=bool(paths.eval_dataset_dir),
                                     gradient_accumulation_steps=setup.plan.gradient_accumulation_steps,
                                     batching=setup.batching.chosen, fsdp=setup.fsdp)
    rank0 = args.process_index == 0
    resume, resumed_step = resume_point(paths, fingerprint, setup, args.world_size)
    tokenizer = AutoTokenizer.from_pretrained(paths.model_dir)
    model = load_and_shard(run, paths, setup, args.local_process_index, rank0)
    manifest = start_manifest(run, paths, setup, args, model, digest, resumed_step) if rank0 else None
    log.info("rank %d/%d precision=%s resume=%s attention=%s/%s plan=%s batching=%s (%s) parallelism=%s (%s)",
             args.process_index, args.world_size, setup.precision, resume or "none", setup.attention.implementation,
             setup.attention.backend, setup.plan.model_dump(), setup.batching.chosen, setup.batching.reason,
             setup.parallel.strategy, setup.parallel.reason)
    trainer, preemption = build_trainer(run, paths, setup, args, model, tokenizer, fingerprint, stop)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return finish(run, paths, trainer, preemption, tokenizer, setup, manifest, rank0)


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
    except checkpoints.SaveFailed as error:
        print(f"finetune: {error}", file=sys.stderr)
        return checkpoints.SAVE_FAILED_EXIT


def exit_rank(code: int) -> NoReturn:
    """End a rank of a multi-process run without the interpreter's finalization. Its gloo process group outlives
    `destroy_process_group` once torch._dynamo is imported (peft and bitsandbytes import it; see the readiness check,
    workloads/checks/gpu.py), and a gloo worker thread that drops Python objects while the interpreter finalizes is
    ended by pthread_exit across a C++ frame: std::terminate, the rank aborts after its work is done, and srun's
    --kill-on-bad-exit kills the job's other ranks (a rehearsal training job ended 137 that way after saving its
    adapter). Everything the rank writes is closed by then; the logs are flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    code = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        exit_rank(code)
    sys.exit(code)
