"""LoRA adapters registered as stored runs, without training: for the serving tests and bench/serve.py.

Each adapter is a PEFT LoRA with distinct non-zero weights (seeded; B not zero, unlike PEFT's initialisation),
saved in PEFT's layout and registered in a run store: a run manifest naming the adapter, its base's hash (the
base's prepare manifest) and a dataset hash, uploaded with the store's own upload_run."""

from __future__ import annotations

import json
from pathlib import Path

from documents.run_manifest import RUN_MANIFEST_NAME, model_hash
from infra.runs.store import LocalStore, upload_run

STACK = "local"


def save_adapter(base_dir: Path, out: Path, rank: int, seed: int, alpha: int | None = None,
                 targets: tuple[str, ...] = ("q_proj", "v_proj", "o_proj"), dora: bool = False) -> Path:
    """A LoRA adapter with random non-zero A and B (PEFT's default starts B at zero: no effect at all); alpha
    defaults to twice the rank."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    lora = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, target_modules=list(targets), use_dora=dora,
                      init_lora_weights=False, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, weight in peft_model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0.0, 0.5)
    peft_model.save_pretrained(out)
    return out


def register_run(store: LocalStore, root: Path, run_id: str, base_dir: Path, adapter_dir: Path, rank: int,
                 stack: str = STACK) -> None:
    """A finished run of `base_dir` in the store: its config, its manifest (adapter, base hash, data hash)."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    config = {"name": run_id, "paths": {"root": str(root)}, "model": {"source": f"dir:{base_dir}"},
              "data": {"source": "sample", "rows": 4}, "train": {"lora": {"r": rank}}}
    config_file = run_dir / "run.json"
    config_file.write_text(json.dumps(config))
    manifest = {
        "version": 1, "run": run_id, "config_sha256": "0" * 64, "config": config, "precision": "fp32",
        "dataset": {"path": str(run_dir / "data"), "sha256": f"{rank:064x}"},
        "base_model": model_hash(base_dir), "packages": {}, "world_size": 1, "nodes": 1,
        "status": "completed", "adapter": str(adapter_dir),
    }
    (run_dir / RUN_MANIFEST_NAME).write_text(json.dumps(manifest))
    upload_run(store, stack, run_id, config_file, train_run_dir=run_dir, results_dir=run_dir / "none")
