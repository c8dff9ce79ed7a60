"""Training metrics: one JSON line per logged step (rank 0), step logs, and the loss-curve PNG."""

from __future__ import annotations

import json
import logging
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from workloads.common.atomic import atomic_file, write_text_atomic

log = logging.getLogger("workloads.train.metrics")


class TokenCounter:
    """Real and processed tokens seen by this rank since the last read."""

    def __init__(self) -> None:
        self.real = 0
        self.processed = 0

    def add(self, real: int, processed: int) -> None:
        self.real += real
        self.processed += processed

    def take_global(self, device: torch.device | str = "cpu") -> tuple[int, int]:
        counts = torch.tensor([self.real, self.processed], dtype=torch.float64, device=device)
        self.real = self.processed = 0
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(counts)
        return int(counts[0]), int(counts[1])


def peak_memory_mb() -> float:
    """Peak GPU memory allocated by this process when on GPU, else its peak resident set."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpu_utilization() -> float | None:
    if not torch.cuda.is_available():
        return None
    try:
        return float(torch.cuda.utilization())
    except Exception:  # noqa: BLE001 - pynvml missing or NVML unavailable
        return None


class MetricsCallback(TrainerCallback):
    """Appends step, loss, lr, grad norm, tokens/s, padding efficiency, memory (and GPU util) to metrics.jsonl."""

    def __init__(self, path: Path, counter: TokenCounter) -> None:
        self.path = path
        self.counter = counter
        self.last_time = time.perf_counter()
        self.real_total = 0
        self.processed_total = 0

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        self.last_time = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN201
        logs = logs or {}
        if "loss" not in logs and "eval_loss" not in logs:
            return
        record: dict[str, Any] = {"step": state.global_step, "epoch": round(state.epoch or 0.0, 4)}
        if "loss" in logs:
            device = args.device if torch.cuda.is_available() else "cpu"
            real, processed = self.counter.take_global(device)
            now = time.perf_counter()
            elapsed, self.last_time = now - self.last_time, now
            self.real_total += real
            self.processed_total += processed
            record.update({
                "loss": logs["loss"],
                "lr": logs.get("learning_rate"),
                "grad_norm": logs.get("grad_norm"),
                "tokens_per_s": round(real / elapsed, 2) if elapsed > 0 else None,
                "tokens": real,
                "padding_efficiency": round(real / processed, 4) if processed else None,
                "memory_mb": round(peak_memory_mb(), 1),
            })
            util = gpu_utilization()
            if util is not None:
                record["gpu_util"] = util
                if record["tokens_per_s"] is not None:
                    record["tokens_per_second_per_gpu"] = round(record["tokens_per_s"] / args.world_size, 2)
        if "eval_loss" in logs:
            record["eval_loss"] = logs["eval_loss"]
        if not state.is_world_process_zero:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        log.info("step %d/%d %s", state.global_step, state.max_steps,
                 " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()
                          if k not in ("step",) and v is not None))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: skipping a torn line", path)
    return rows


def truncate_metrics(path: Path, step: int) -> None:
    """Keep only records up to `step` (the checkpoint a run resumes from), so resumed steps are not doubled."""
    kept = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


def plot_loss(metrics: Path, png: Path) -> None:
    """Loss (and eval loss) against optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics)
    train = [(r["step"], r["loss"]) for r in rows if r.get("loss") is not None]
    evals = [(r["step"], r["eval_loss"]) for r in rows if r.get("eval_loss") is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        ax.plot(*zip(*train), marker=".", label="train loss")
    if evals:
        ax.plot(*zip(*evals), marker="o", label="eval loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (assistant tokens)")
    ax.set_title(f"Training loss: {metrics.parent.name}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_file(png) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
