"""Training throughput: this trainer (packed batches) against a naive HF Trainer (every row padded to max length).

    python bench/train.py [--config workloads/configs/local.json] [--steps 6]

Both arms load the same base (the run config's quantization and LoRA), read the same tokenized train split and
run the same number of optimizer steps with the same micro-batch setting, each in its own process (so peak
memory is per arm). Prints JSON: effective tokens/s (non-padding tokens per second of training), padding
efficiency (real tokens / processed tokens) and peak memory of each arm, and the ratio of effective tokens/s.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds scripts named like stdlib modules (tokenize.py); keep it off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_arm(arm: str, config: str, steps: int) -> dict[str, Any]:
    import torch
    from datasets import load_from_disk
    from transformers import AutoTokenizer, Trainer

    from workloads.config import load_run_config
    from workloads.train.batching import PackedCollator, PackedDataset, PaddedCollator, batch_tokens
    from workloads.train.config import create_training_arguments, detect_precision, max_length, train_paths
    from workloads.train.finetune import FinetuneTrainer, load_model
    from workloads.train.metrics import TokenCounter, peak_memory_mb

    class NaiveTrainer(Trainer):
        """Plain HF Trainer; only counts the tokens of the batches it trains on."""

        def training_step(self, model, inputs, num_items_in_batch=None):  # noqa: ANN001, ANN202
            counter.add(*batch_tokens(inputs))
            return super().training_step(model, inputs, num_items_in_batch)

    run = load_run_config(config)
    train = run.train.model_copy(update={"max_steps": steps, "save_steps": steps * 10, "eval_steps": None,
                                         "logging_steps": steps})
    paths = train_paths(run)
    length = max_length(run)
    precision = detect_precision(train.precision)
    tokenizer = AutoTokenizer.from_pretrained(paths.model_dir)
    rows = load_from_disk(str(paths.dataset_dir))
    model = load_model(paths.model_dir, train, precision, 0)
    counter = TokenCounter()
    with tempfile.TemporaryDirectory() as scratch:
        args = create_training_arguments(train, Path(scratch), precision)
        args.save_strategy = "no"
        if arm == "packed":
            data = PackedDataset(rows, train.micro_batch_size * length, length, train.seed)
            trainer: Trainer = FinetuneTrainer(model=model, args=args, train_dataset=data,
                                               data_collator=PackedCollator(), counter=counter, keep=1)
        else:
            args.per_device_train_batch_size = train.micro_batch_size
            args.train_sampling_strategy = "random"
            data = rows.filter(lambda n: n <= length, input_columns="length")
            trainer = NaiveTrainer(model=model, args=args, train_dataset=data,
                                   data_collator=PaddedCollator(tokenizer, pad_to=length))
        start = time.perf_counter()
        trainer.train()
        elapsed = time.perf_counter() - start
    return {
        "steps": trainer.state.global_step,
        "seconds": round(elapsed, 2),
        "real_tokens": counter.real,
        "processed_tokens": counter.processed,
        "effective_tokens_per_s": round(counter.real / elapsed, 2),
        "padding_efficiency": round(counter.real / counter.processed, 4),
        "peak_memory_mb": round(peak_memory_mb(), 1),
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "workloads" / "configs" / "local.json"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--arm", choices=["packed", "naive"], help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.arm:
        print(json.dumps(run_arm(options.arm, options.config, options.steps)))
        return 0
    results: dict[str, Any] = {"config": options.config, "steps": options.steps}
    for arm in ("naive", "packed"):
        print(f"bench/train.py: running the {arm} arm ({options.steps} steps)", file=sys.stderr, flush=True)
        proc = subprocess.run(
            [sys.executable, __file__, "--config", options.config, "--steps", str(options.steps), "--arm", arm],
            capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"},
        )
        if proc.returncode != 0:
            print(proc.stderr[-4000:], file=sys.stderr)
            return proc.returncode
        results[arm] = json.loads(proc.stdout.strip().splitlines()[-1])
    results["ratio_effective_tokens_per_s"] = round(
        results["packed"]["effective_tokens_per_s"] / results["naive"]["effective_tokens_per_s"], 2
    )
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
