"""The training loss's share of a step: transformers' causal LM loss (logits at every position) against the
loss at labelled positions only (workloads/train/label_loss.py, what the training job runs), and on CUDA with
liger-kernel Liger's fused linear + cross-entropy at those positions (`train.fused_loss`); prints JSON.

    .venv/bin/python bench/train_loss.py [--config workloads/configs/local.json] [--rows 6] [--repeats 2]

Every arm is the training job's own model (`workloads.train.finetune.load_model`: the run config's base,
quantization and LoRA, the job's attention and precision), in this one process, one thread per rank as the job
runs it on CPU (`--threads`, default 1). Each times forward + backward of the same `--rows` rows of the run's
tokenized train split (assistant-only labels), one row per micro-batch as the local run trains, `--repeats`
passes after one warm-up pass; arms alternate pass by pass so a drift in machine speed falls on all of them.
Figures: seconds per micro-batch (median of the passes' means), the labelled share of the positions, the losses
(equal across arms up to rounding: `max_loss_difference`) and each arm's speed-up over `causal_lm_loss`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds tokenize.py, which would shadow the standard library module of that name.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from documents.run_config import load_run_config  # noqa: E402
from planning.memory import require_train  # noqa: E402
from workloads.train import attention, fused_loss, label_loss  # noqa: E402
from workloads.train.batching import IGNORE_INDEX  # noqa: E402
from workloads.train.config import detect_precision, train_paths  # noqa: E402
from workloads.train.finetune import load_model, read_tokenized  # noqa: E402


def arm_model(run: Any, arm: str) -> Any:
    """The training job's model; for `causal_lm_loss` with the instance's loss override removed (transformers'
    own forward), for `liger_fused` routed through Liger."""
    train = require_train(run)
    choice = attention.choose(cuda=torch.cuda.is_available(), packed=False)
    model = load_model(train_paths(run).model_dir, train, detect_precision(train.precision), 0, choice,
                       checkpointing=train.gradient_checkpointing)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    vars(base).pop("forward", None)
    if arm == "labelled_positions":
        label_loss.enable(base)
    elif arm == "liger_fused":
        fused_loss.enable(base)
    return model.train()


def one_pass(model: Any, batches: list[dict[str, torch.Tensor]]) -> tuple[float, list[float]]:
    """Mean seconds per micro-batch of forward + backward, and each micro-batch's loss."""
    losses = []
    start = time.perf_counter()
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.item())
    model.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / len(batches), losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(HERE.parent / "workloads" / "configs" / "local.json"))
    parser.add_argument("--rows", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = load_run_config(args.config)
    rows = read_tokenized(train_paths(run).dataset_dir).select(range(args.rows))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batches = [{key: torch.tensor([row[key]], device=device) for key in ("input_ids", "attention_mask", "labels")}
               for row in rows]
    arms = ["causal_lm_loss", "labelled_positions"] + (["liger_fused"] if fused_loss.available() else [])
    models = {arm: arm_model(run, arm) for arm in arms}
    for model in models.values():
        one_pass(model, batches[:1])
    seconds: dict[str, list[float]] = {arm: [] for arm in arms}
    losses: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for arm, model in models.items():
            took, losses[arm] = one_pass(model, batches)
            seconds[arm].append(took)
    median = {arm: statistics.median(values) for arm, values in seconds.items()}
    positions = sum(int(b["labels"].numel()) for b in batches)
    labelled = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)
    print(json.dumps({
        "config": args.config, "device": device, "threads": args.threads, "rows": args.rows,
        "repeats": args.repeats, "positions": positions, "labelled_positions": labelled,
        "labelled_share": round(labelled / positions, 4),
        "seconds_per_micro_batch": {arm: round(value, 4) for arm, value in median.items()},
        "speedup_over_causal_lm_loss": {arm: round(median["causal_lm_loss"] / value, 3)
                                        for arm, value in median.items() if arm != "causal_lm_loss"},
        "max_loss_difference": max(abs(a - b) for arm in arms[1:]
                                   for a, b in zip(losses[arm], losses["causal_lm_loss"])),
    }, indent=2))


if __name__ == "__main__":
    main()
