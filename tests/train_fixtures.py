"""Training fixtures: run configs with a `train` section over the tiny prepared run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from documents.run_config import RunConfig, parse_run_config


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
