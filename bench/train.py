"""Training throughput and memory: this trainer against TRL's SFTTrainer and a naive padded HF Trainer, on two
shapes of data.

    python bench/train.py [--config workloads/configs/local.json] [--rows 48] [--epochs 2]   # or [--steps 8 --warmup 2]
                          [--arms naive,auto,packed,grouped,trl] [--datasets dense,mixed]
                          [--model-dir DIR] [--dataset-dir DIR] [--train JSON]
                          [--random-base Qwen/Qwen3-14B --tokenizer DIR]     # GPU: random weights, known shape

Data sets: `dense` is the run config's tokenized train split (or --dataset-dir) as it is (local.json: finance
reports cut to max_length, most rows exactly 384 tokens); `mixed` is built from it deterministically: every
fourth of its rows (the long reports) beside three short chat turns each: the project's synthetic conversations
(workloads/data/synthetic.py, seed 0, in index order) tokenized with the base's chat template, assistant-only
labels, keeping those of at most max_length / 2 tokens; interleaved long, short, short, short (`build_mixed`,
cached under the run root's bench/ folder).

Every arm loads the same base (the run config's quantization and LoRA), reads the same tokenized train split
(assistant-only labels) and runs the same number of optimizer steps of the same global batch
(micro_batch_size x gradient_accumulation_steps x max_length tokens), each in its own process, so peak memory
is per arm. Every arm logs through the training job's own `MetricsCallback` into a metrics.jsonl, and every
figure below is read from those records the way the cost model reads a real run's
(`documents.throughput.run_tokens_per_second`):

- `naive`: HF Trainer, every row padded to max_length, micro_batch_size rows per micro-batch (SDPA).
- `auto`: the training job itself (`workloads.train.finetune.train_run`, what `python -m
  workloads.train.finetune` runs) as shipped: `batching: auto` picks packed or grouped from the data's lengths
  (the decision and its figures, from the run manifest, are in the arm's `batching`).
- `packed`: the training job forced to pack: micro-batches of one fixed token length from the batch plan (`auto`
  sizing on a GPU), varlen flash attention on CUDA; `packed_fused` adds the fused linear + cross-entropy (CUDA).
- `grouped`: the training job forced to pad: micro_batch_size rows of similar length, padded to the longest.
- `trl`: TRL's SFTTrainer with packing (best-fit decreasing) and padding-free batches, max_length set to the
  packed arm's micro-batch tokens, on the same labels (its own chunked LM head).

What is timed: by default every arm trains `--epochs` passes (default 2) over the same fixed sample of `--rows`
rows drawn evenly across the data set's length distribution (`length_sample`: the rows at evenly spaced ranks of
length); the first passes warm up, the last is timed, so every arm is timed over the same rows and the same real
tokens (`real_tokens`, equal across arms: `same_real_tokens`). With `--steps N` instead, each arm's steps after
the first `--warmup` are timed, whatever rows they hold (the grouped sampler puts its longest rows first). Prints JSON: per arm effective tokens/s (tokens that
are not padding, per second), processed tokens/s, padding efficiency, peak memory (allocated and reserved on
GPU, resident on CPU), the memory estimate, final and mean losses, and on a GPU the MFU on the 6 x parameters
basis; per data set, then the ratios of the auto, packed and grouped arms to the others (`auto_over_naive`, ...), each
split into its two factors: the speed per processed token (`..._per_processed_token`: the attention, masked over
padding or not, and the batch shape) and the padding saved (`..._padding_saved`: the ratio of padding
efficiencies); their product is the ratio of effective tokens/s.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds scripts named like stdlib modules (tokenize.py); keep it off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = ("naive", "auto", "packed", "grouped", "packed_fused", "trl")
VERSIONED = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes")
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_NUM_THREADS")
OURS = ("auto", "packed", "grouped", "packed_fused")
DATASETS = ("dense", "mixed")
MIXED_SHORT_PER_LONG = 3
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "L40S": 362.0}  # dense bf16 datasheet figures


def build_random_base(name: str, out: Path, tokenizer_dir: Path) -> Path:
    """A base model folder with random weights in the shape of `name` (a known model) plus the given tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    from planning.model_shapes import KNOWN

    shape = KNOWN[name]
    kind = Qwen3Config if shape.qk_norm else LlamaConfig
    config = kind(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                  num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                  head_dim=shape.head_dim, tie_word_embeddings=shape.tied_embeddings, max_position_embeddings=40960)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, max_shard_size="4GB")
    for item in tokenizer_dir.iterdir():
        if item.name.startswith("tokenizer") or item.name in ("chat_template.jinja", "special_tokens_map.json"):
            shutil.copy2(item, staging / item.name)
    staging.rename(out)
    return out


def prepare_random_base(name: str, out: Path, tokenizer_dir: Path) -> Path:
    """`build_random_base` in a child process, so that this parent never holds device memory.

    Built here, the weights' memory would stay in this process's CUDA cache (about 28 GiB for the 14B shape)
    while every arm runs, and an arm that needs more than the rest of the GPU would run out of memory.
    """
    if not (out / "config.json").is_file():
        subprocess.run([sys.executable, __file__, "--random-base", name, "--model-dir", str(out),
                        "--tokenizer", str(tokenizer_dir), "--build-base-only"], check=True)
    return out


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`base` with `override`'s values, nested objects merged key by key (`{"lora": {"dropout": 0}}`)."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def build_mixed(dense_dir: Path, tokenizer_dir: Path, max_length: int, out: Path) -> Path:
    """The mixed-length set: every fourth row of `dense_dir` beside MIXED_SHORT_PER_LONG short synthetic chat turns
    each (seed 0 in index order, tokenized like the prepare stage does, those of at most max_length / 2 tokens
    kept), interleaved; saved once at `out`."""
    from datasets import Dataset, load_from_disk

    from workloads.data.convert import to_chat_row
    from workloads.data.synthetic import conversation
    from workloads.data.tokenize import encode_batch, load_tokenizer, max_token_chars

    if (out / "dataset_info.json").is_file():
        return out
    columns = ("input_ids", "attention_mask", "labels", "length")
    long = load_from_disk(str(dense_dir)).select_columns(list(columns))
    long = long.select(range(0, len(long), MIXED_SHORT_PER_LONG + 1))
    tokenizer = load_tokenizer(tokenizer_dir)
    count, chunk = MIXED_SHORT_PER_LONG * len(long), 256
    max_chars = max_length * max_token_chars(tokenizer)
    short: list[dict[str, Any]] = []
    for start in range(0, 100 * count, chunk):
        chats = {"messages": [to_chat_row(conversation(0, i)).turns() for i in range(start, start + chunk)]}
        encoded = encode_batch(chats, list(range(chunk)), tokenizer, max_length, "truncate", max_chars)
        short += [{c: encoded[c][i] for c in columns} for i in range(chunk)
                  if encoded["status"][i] == "kept" and encoded["length"][i] <= max_length // 2]
        if len(short) >= count:
            break
    rows = []
    for index, row in enumerate(long):
        rows.append(row)
        rows.extend(short[MIXED_SHORT_PER_LONG * index: MIXED_SHORT_PER_LONG * (index + 1)])
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    Dataset.from_list(rows).save_to_disk(str(staging))
    staging.rename(out)
    return out


def prepare_mixed(options: argparse.Namespace) -> Path:
    """`build_mixed` for the run's data in a child process (the parent stays without torch); returns its folder."""
    from workloads.train.config import max_length, train_paths

    run = load_run(options)
    paths = train_paths(run)
    length = max_length(run)
    source = hashlib.sha256(str(paths.dataset_dir).encode()).hexdigest()[:12]
    out = run.root / "bench" / f"mixed-{length}-{source}"
    if not (out / "dataset_info.json").is_file():
        subprocess.run([sys.executable, __file__, "--config", options.config, "--build-mixed-only",
                        "--model-dir", str(paths.model_dir), "--dataset-dir", str(paths.dataset_dir),
                        "--mixed-out", str(out), "--train", options.train or "{}"], check=True)
    return out


def length_ranks(lengths: list[int], rows: int) -> list[int]:
    """Indices of `rows` rows at evenly spaced ranks of length (shortest to longest, ties by index), in index
    order: a fixed sample across the length distribution."""
    if rows >= len(lengths):
        return list(range(len(lengths)))
    ranked = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return sorted(ranked[round(k * (len(ranked) - 1) / (rows - 1))] for k in range(rows)) if rows > 1 else [ranked[0]]


def length_sample(dataset_dir: Path, rows: int, out: Path) -> Path:
    """The `length_ranks` sample of a tokenized folder, saved at `out` (the same rows for every arm)."""
    from datasets import load_from_disk

    data = load_from_disk(str(dataset_dir))
    data.select(length_ranks(list(data["length"]), rows)).save_to_disk(str(out))
    return out


def load_run(options: argparse.Namespace) -> Any:
    from documents.run_config import load_run_config, parse_run_config
    from documents.sections.train import MAX_STEPS

    run = load_run_config(options.config)
    data = run.model_dump(mode="json")
    train = merged(data["train"], json.loads(options.train or "{}"))
    if options.model_dir:
        train["model_dir"] = str(Path(options.model_dir).resolve())
    if options.dataset_dir:
        train["dataset_dir"] = str(Path(options.dataset_dir).resolve())
    if options.steps:
        train.update({"max_steps": options.steps, "save_steps": options.steps * 10})
    else:
        train.update({"max_steps": None, "epochs": options.epochs, "save_steps": MAX_STEPS})
    train.update({"eval_steps": None, "logging_steps": 1})
    return parse_run_config({**data, "train": train}, options.config)


def timed_figures(records: list[Any], warmup: int, epochs: int | None = None) -> dict[str, Any]:
    """Throughput and losses of a run's metrics.jsonl records (one per optimizer step): of the last of `epochs`
    passes where given, else after `warmup` steps, with the training job's own definition of tokens/s
    (documents.throughput.run_tokens_per_second)."""
    from documents.throughput import run_tokens_per_second

    steps = [r for r in records if r.loss is not None]
    window = (lambda r: r.epoch > epochs - 1) if epochs else (lambda r: r.step > warmup)
    timed = [r for r in steps if window(r) and r.tokens and r.tokens_per_second]
    effective = run_tokens_per_second(timed)
    if effective is None:
        where = f"in the last of {epochs} passes" if epochs else f"after the first {warmup}"
        raise RuntimeError(f"no timed step {where} in {len(steps)} logged steps")
    real = sum(r.tokens for r in timed)
    processed = sum(r.tokens / r.padding_efficiency for r in timed if r.padding_efficiency)
    seconds = real / effective
    losses = [r.loss for r in steps]
    half = losses[len(losses) // 2:]
    return {
        "steps": steps[-1].step,
        "timed_steps": len(timed),
        "seconds": round(seconds, 2),
        "real_tokens": real,
        "processed_tokens": round(processed),
        "effective_tokens_per_second": round(effective, 2),
        "processed_tokens_per_second": round(processed / seconds, 2),
        "padding_efficiency": round(real / processed, 4),
        "final_loss": round(losses[-1], 4),
        "mean_loss_second_half": round(sum(half) / len(half), 4),
    }


def train_ours(run: Any, scratch: Path) -> tuple[Path, dict[str, Any]]:
    """The training job's own entry point (`workloads.train.finetune.train_run`) on `run`, writing its records
    under `scratch`; the run folder and what its run manifest says of the batching, plan and attention."""
    from documents.run_manifest import RUN_MANIFEST_NAME, load_run_manifest
    from workloads.train.config import train_paths
    from workloads.train.finetune import train_run

    run = run.model_copy(update={"train": run.train.model_copy(update={"output_dir": str(scratch / "run")})})
    if train_run(run) != 0:
        raise RuntimeError("the training job's entry point stopped before the last step")
    run_dir = train_paths(run).run_dir
    manifest = load_run_manifest(run_dir / RUN_MANIFEST_NAME)
    if manifest is None or manifest.batch_plan is None or manifest.batching is None:
        raise RuntimeError(f"{run_dir}: the run wrote no run manifest with its batch plan and batching")
    plan = manifest.batch_plan
    return run_dir, {
        "micro_batch_tokens": plan.micro_batch_tokens, "batching": manifest.batching.model_dump(),
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "gradient_checkpointing": plan.gradient_checkpointing, "attention": manifest.attention.model_dump(),
        "estimate_gib": plan.estimate_gib,
    }


def train_peer(arm: str, run: Any, scratch: Path) -> tuple[Path, dict[str, Any]]:
    """The naive padded HF Trainer or TRL's SFTTrainer on the same base, rows and global batch, logging through
    the training job's MetricsCallback into `scratch`/metrics.jsonl."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoTokenizer, Trainer

    from workloads.train import attention
    from workloads.train.batching import PaddedCollator, batch_tokens
    from workloads.train.config import create_training_arguments, detect_precision, max_length, train_paths
    from workloads.train.finetune import batch_plan, load_model
    from workloads.train.metrics_callback import MetricsCallback, TokenCounter

    train = run.train
    paths = train_paths(run)
    length = max_length(run)
    precision = detect_precision(train.precision)
    plan = batch_plan(run, paths.model_dir, "packed")
    tokenizer = AutoTokenizer.from_pretrained(paths.model_dir)
    rows = load_from_disk(str(paths.dataset_dir))
    choice = attention.choose(torch.cuda.is_available(), arm == "trl")
    model = load_model(paths.model_dir, train, precision, 0, choice, plan.gradient_checkpointing)
    counter = TokenCounter()
    logged = MetricsCallback(scratch / "metrics.jsonl", counter)

    def counted(cls: type) -> type:
        class Counted(cls):  # type: ignore[misc, valid-type]
            def training_step(self, model, inputs, num_items_in_batch=None):  # noqa: ANN001, ANN202
                counter.add(*batch_tokens(inputs))
                return super().training_step(model, inputs, num_items_in_batch)

        return Counted

    args = create_training_arguments(train, scratch / "checkpoints", precision,
                                     gradient_accumulation_steps=plan.gradient_accumulation_steps, batching="packed")
    args.save_strategy = "no"
    if arm == "naive":
        args.per_device_train_batch_size = train.micro_batch_size
        args.gradient_accumulation_steps = train.gradient_accumulation_steps
        data = rows.filter(lambda n: n <= length, input_columns="length")
        trainer: Trainer = counted(Trainer)(model=model, args=args, train_dataset=data, callbacks=[logged],
                                            data_collator=PaddedCollator(tokenizer, pad_to=length))
        micro = train.micro_batch_size * length
    else:
        from trl import SFTConfig, SFTTrainer

        same = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
        config = SFTConfig(**same, max_length=plan.micro_batch_tokens, packing=True, packing_strategy="bfd",
                           padding_free=True, dataset_num_proc=1)
        trainer = counted(SFTTrainer)(model=model, args=config, train_dataset=rows.select_columns(["input_ids", "labels"]),
                                      processing_class=tokenizer, callbacks=[logged])
        micro = plan.micro_batch_tokens
    trainer.train()
    return scratch, {"micro_batch_tokens": micro, "batching": None,
                     "gradient_accumulation_steps": args.gradient_accumulation_steps,
                     "gradient_checkpointing": plan.gradient_checkpointing, "attention": choice.model_dump()}


def run_arm(arm: str, options: argparse.Namespace) -> dict[str, Any]:
    """One arm in this process: the figures of its metrics.jsonl after warm-up, its peak memory, its setup."""
    import torch

    from documents.metrics import METRICS_NAME, load_metrics
    from workloads.train.config import train_paths
    from workloads.train.metrics_callback import peak_memory_mb
    from planning.model_shapes import shape_for_source

    run = load_run(options)
    if arm in OURS:
        forced = {"batching": "packed" if arm == "packed_fused" else arm, "fused_loss": arm == "packed_fused"}
        run = run.model_copy(update={"train": run.train.model_copy(update=forced)})
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as scratch:
        if not options.steps:
            sample = length_sample(train_paths(run).dataset_dir, options.rows, Path(scratch) / "sample")
            run = run.model_copy(update={"train": run.train.model_copy(update={"dataset_dir": str(sample)})})
        run_dir, setup = train_ours(run, Path(scratch)) if arm in OURS else train_peer(arm, run, Path(scratch))
        records = load_metrics(run_dir / METRICS_NAME)
    epochs = None if options.steps else options.epochs
    result: dict[str, Any] = {**timed_figures(records, options.warmup, epochs), **setup,
                              "kbit_upcast": run.train.kbit_upcast, "threads": torch.get_num_threads()}
    if cuda:
        shape = shape_for_source(f"dir:{train_paths(run).model_dir}")
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
        rate = result["effective_tokens_per_second"]
        result.update({
            "device": name,
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
            "params": shape.params,
            "mfu_6n": round(6 * shape.params * rate / (peak * 1e12), 4) if peak else None,
        })
    else:
        result.pop("estimate_gib", None)  # the memory estimate plans GPU memory
        result["peak_memory_mb"] = round(peak_memory_mb(), 1)
    return result


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Effective tokens/s of the auto, packed and grouped arms over the others', each with its two factors: per processed
    token and padding saved (effective = processed x padding efficiency); whether every arm timed the same real
    tokens."""
    out: dict[str, Any] = {}
    for ours in ("auto", "packed", "grouped"):
        mine = results.get(ours, {})
        for other in ("naive", "trl", "packed", "grouped", "packed_fused"):
            theirs = results.get(other, {})
            if other == ours or not (mine.get("effective_tokens_per_second") and
                                     theirs.get("effective_tokens_per_second")):
                continue
            out[f"{ours}_over_{other}"] = round(mine["effective_tokens_per_second"] /
                                                theirs["effective_tokens_per_second"], 3)
            out[f"{ours}_over_{other}_per_processed_token"] = round(mine["processed_tokens_per_second"] /
                                                                    theirs["processed_tokens_per_second"], 3)
            out[f"{ours}_over_{other}_padding_saved"] = round(mine["padding_efficiency"] /
                                                              theirs["padding_efficiency"], 3)
    real = {arm: figures["real_tokens"] for arm, figures in results.items() if "real_tokens" in figures}
    if real:
        out["same_real_tokens"] = len(set(real.values())) == 1
    return out


def environment() -> dict[str, Any]:
    """What can make the same arm's figure differ between machines: library versions, CPUs and thread settings."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        cpuinfo = ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 platform.processor() or platform.machine())
    return {
        "versions": {name: installed(name) for name in VERSIONED},
        "python": platform.python_version(),
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "thread_env": {name: os.environ.get(name) for name in THREAD_ENV},
    }


def run_arms(arms: list[str], options: argparse.Namespace, forwarded: list[str]) -> dict[str, Any]:
    """Each arm in its own process on the data of `forwarded` (the last --dataset-dir wins); results and ratios,
    with the machine's 1, 5 and 15 minute load averages before and after each arm."""
    results: dict[str, Any] = {}
    for arm in arms:
        length = f"{options.steps} steps" if options.steps else f"{options.epochs} passes over {options.rows} rows"
        print(f"bench/train.py: running the {arm} arm ({length})", file=sys.stderr, flush=True)
        before = [round(x, 2) for x in os.getloadavg()]
        proc = subprocess.run([sys.executable, __file__, *forwarded, "--arm", arm], capture_output=True, text=True,
                              env={**os.environ, "TQDM_DISABLE": "1"})
        load = {"before": before, "after": [round(x, 2) for x in os.getloadavg()]}
        if proc.returncode != 0:
            print(proc.stderr[-6000:], file=sys.stderr)
            results[arm] = {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed",
                            "load_average": load}
            continue
        results[arm] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "load_average": load}
    return {**results, **ratios(results)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "workloads" / "configs" / "local.json"))
    parser.add_argument("--rows", type=int, default=48,
                        help="rows of the fixed sample across the length distribution every arm trains on")
    parser.add_argument("--epochs", type=int, default=2, help="passes over the sample; the last is timed")
    parser.add_argument("--steps", type=int,
                        help="instead of the sample: train this many steps of the whole data set, time after --warmup")
    parser.add_argument("--warmup", type=int, default=2, help="with --steps: optimizer steps left out of the timings")
    parser.add_argument("--arms", default="naive,auto,packed,grouped,trl",
                        help=f"comma-separated, from {', '.join(ARMS)}")
    parser.add_argument("--datasets", default="dense,mixed", help=f"comma-separated, from {', '.join(DATASETS)}")
    parser.add_argument("--model-dir", help="base model folder (default: the run config's)")
    parser.add_argument("--dataset-dir", help="tokenized train folder (default: the run config's)")
    parser.add_argument("--train", help="JSON object merged (nested objects too) into the run config's train section")
    parser.add_argument("--random-base", help="build --model-dir with random weights in this known model's shape")
    parser.add_argument("--tokenizer", help="tokenizer folder copied into a --random-base model")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the arguments (arms, data sets, the run config with --train merged), print them")
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--build-base-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--build-mixed-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mixed-out", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.steps is not None and not 1 <= options.warmup < options.steps:
        parser.error("--warmup must be at least 1 and below --steps")
    if options.steps is None and (options.rows < 2 or options.epochs < 2):
        parser.error("--rows and --epochs must be at least 2 (the first passes warm up, the last is timed)")
    if options.build_base_only:
        build_random_base(options.random_base, Path(options.model_dir), Path(options.tokenizer))
        return 0
    if options.build_mixed_only:
        from workloads.train.config import max_length

        build_mixed(Path(options.dataset_dir), Path(options.model_dir), max_length(load_run(options)),
                    Path(options.mixed_out))
        return 0
    if options.arm:
        print(json.dumps(run_arm(options.arm, options)))
        return 0
    arms = [a.strip() for a in options.arms.split(",") if a.strip()]
    datasets = [d.strip() for d in options.datasets.split(",") if d.strip()]
    unknown = sorted(set(arms) - set(ARMS)) + sorted(set(datasets) - set(DATASETS))
    if unknown:
        parser.error(f"unknown arms or data sets {unknown}; arms: {', '.join(ARMS)}; data sets: {', '.join(DATASETS)}")
    try:
        train = json.loads(options.train or "{}")
    except json.JSONDecodeError as error:
        parser.error(f"--train: not JSON ({error})")
    if not isinstance(train, dict):
        parser.error("--train: must be a JSON object")
    if options.dry_run:
        try:
            load_run(options)
        except ValueError as error:
            parser.error(f"--config/--train: {error}")
        print(json.dumps({"config": options.config, "arms": arms, "datasets": datasets, "steps": options.steps,
                          "warmup": options.warmup, "rows": options.rows, "epochs": options.epochs, "train": train,
                          "random_base": options.random_base}))
        return 0
    if options.random_base:
        if not (options.model_dir and options.tokenizer):
            parser.error("--random-base needs --model-dir and --tokenizer")
        prepare_random_base(options.random_base, Path(options.model_dir), Path(options.tokenizer))
    return bench(options, arms, datasets, train, argv)


def bench(options: argparse.Namespace, arms: list[str], datasets: list[str], train: dict[str, Any],
          argv: list[str] | None) -> int:
    """Every arm on every data set, each in a process of its own; the JSON printed (and written to --out)."""
    window = (f"steps after {options.warmup} of {options.steps}" if options.steps else
              f"pass {options.epochs} of {options.epochs} over {options.rows} rows across the length distribution")
    results: dict[str, Any] = {"config": options.config, "timed": window, "steps": options.steps,
                               "warmup": options.warmup, "rows": None if options.steps else options.rows,
                               "epochs": None if options.steps else options.epochs,
                               "train": train, "random_base": options.random_base, "environment": environment(),
                               "datasets": {}}
    forwarded = [a for a in sys.argv[1:] if a not in ("--random-base", options.random_base)] if argv is None else argv
    for name in datasets:
        extra = ["--dataset-dir", str(prepare_mixed(options))] if name == "mixed" else []
        results["datasets"][name] = run_arms(arms, options, [*forwarded, *extra])
    text = json.dumps(results, indent=2)
    if options.out:
        Path(options.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    failed = [a for d in results["datasets"].values() for a in arms if "error" in d[a]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
