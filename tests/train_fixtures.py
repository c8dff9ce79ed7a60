"""Training fixtures: run configs with a `train` section over the tiny prepared run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from documents.metrics import load_metrics
from documents.run_config import RunConfig, parse_run_config

ROOT = Path(__file__).resolve().parents[1]
LOSS_REL_TOL = 1e-5
"""FSDP against DDP over 20 steps, same rows, seed and initial weights. Measured here (2026-11-25, 2 ranks, gloo,
fp32): LoRA identical at every step; full fine-tuning identical for 7 steps, then apart by float32 rounding (the
reduce-scatter and the all-reduce add the ranks' gradients in different orders) up to a relative 4e-7 at step 20.
1e-5 is 25 times that. The runs compared train in fp32 (`precision: fp32`): `auto` is bf16 on a CPU that has it,
where FSDP's mixed-precision policy and DDP's autocast round the full fine-tune's first loss differently (3e-6
apart at step 1), so only fp32 isolates the layouts' own arithmetic."""


def with_train(run: RunConfig, root: Path, **train: Any) -> RunConfig:
    """`run` rooted at `root` (reusing its base model and tokenized data) with the given train section."""
    data = run.model_dump(mode="json")
    data["paths"] = {"root": str(root)}
    data["train"] = {
        "model_dir": str(run.base_model_dir),
        "dataset_dir": str(run.train_tokenized_dir),
        "eval_dataset_dir": str(run.test_tokenized_dir),
        "quantization": "none",
        "max_steps": 4,
        "micro_batch_size": 2,
        "max_length": 256,
        "logging_steps": 1,
        "save_steps": 2,
        "save_total_limit": 2,
        "gradient_checkpointing": False,
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        **train,
    }
    return parse_run_config(data, "with_train")


def write_config(run: RunConfig, path: Path) -> Path:
    path.write_text(json.dumps(run.model_dump(mode="json"), indent=2), encoding="utf-8")
    return path


def torchrun(run: RunConfig, tmp_path: Path, name: str, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """`finetune` over `nproc` local ranks (gloo), one thread each; the log is kept beside the config."""
    config = write_config(run, tmp_path / f"{name}.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
         "-m", "workloads.train.finetune", "--config", str(config)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    (tmp_path / f"{name}.log").write_text(done.stdout + done.stderr)
    return done


def trained(run: RunConfig, tmp_path: Path, name: str, nproc: int = 2) -> tuple[list[float], dict[str, Any]]:
    done = torchrun(run, tmp_path, name, nproc)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    losses = [r.loss for r in load_metrics(run.train_run_dir / "metrics.jsonl") if r.loss is not None]
    return losses, json.loads((run.train_run_dir / "run_manifest.json").read_text())
