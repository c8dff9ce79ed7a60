"""Stored runs with LoRA adapters of the tiny model, and a server that serves them from one process.

Each adapter is a PEFT LoRA with distinct non-zero weights (seeded, B not zero), saved in PEFT's layout and
registered as a run in a local run store: a run manifest naming the adapter, its base's hash (the tiny model's
prepare manifest) and a dataset hash, uploaded with the store's own upload_run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from eval_fixtures import start_server, stop_server

from documents.run_config import RunConfig, parse_run_config
from documents.run_manifest import RUN_MANIFEST_NAME, model_hash
from infra.runs.store import LocalStore, upload_run

STACK = "local"
ADAPTERS = {"desk-earnings": 4, "desk-credit": 8, "desk-filings": 12}
"""name -> LoRA rank; the run id is `run-<name>`."""
SPARE = "desk-spare"


def save_adapter(base_dir: Path, out: Path, rank: int, seed: int) -> None:
    """A LoRA adapter with random non-zero A and B (PEFT's default starts B at zero: no effect at all)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "o_proj"],
                      init_lora_weights=False, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, weight in peft_model.named_parameters():
            if "lora_B" in name:
                weight.normal_(0.0, 0.5)
    peft_model.save_pretrained(out)


def register_run(store: LocalStore, root: Path, run_id: str, base_dir: Path, adapter_dir: Path, rank: int) -> None:
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
    upload_run(store, STACK, run_id, config_file, train_run_dir=run_dir, results_dir=run_dir / "none")


@dataclass
class AdapterRuns:
    run: RunConfig
    """the serving run config: the tiny model as its base, the peft engine, the store below"""
    store_dir: Path
    foreign_run: str
    """a run whose adapter was trained on another base"""

    def run_id(self, name: str) -> str:
        return f"run-{name}"


@pytest.fixture(scope="session")
def adapter_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AdapterRuns:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workloads.model.prepare import prepare_model

    root = tmp_path_factory.mktemp("adapter-runs")
    store = LocalStore(root / "store")
    for seed, (name, rank) in enumerate({**ADAPTERS, SPARE: 4}.items()):
        adapter = root / "adapters" / name
        save_adapter(tiny_model_dir, adapter, rank, seed=10 + seed)
        register_run(store, root / "runs", f"run-{name}", tiny_model_dir, adapter, rank)

    raw = root / "other-raw"
    torch.manual_seed(1)
    other = AutoModelForCausalLM.from_config(AutoModelForCausalLM.from_pretrained(tiny_model_dir).config)
    other.save_pretrained(raw)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(raw)
    other_dir = root / "other" / "base"
    prepare_model(f"dir:{raw}", other_dir)
    save_adapter(other_dir, root / "adapters" / "foreign", 4, seed=99)
    register_run(store, root / "runs", "run-foreign", other_dir, root / "adapters" / "foreign", 4)

    run = parse_run_config({
        "name": "adapters", "paths": {"root": str(root), "model_dir": str(tiny_model_dir.parent)},
        "model": {"source": f"dir:{tiny_model_dir}"}, "data": {"source": "sample", "rows": 4},
        "serve": {"engine": "peft", "device": "cpu", "dtype": "float32", "runs_store": str(root / "store"),
                  "max_tokens_limit": 256},
    }, "adapter_fixtures")
    return AdapterRuns(run, root / "store", "run-foreign")


@dataclass
class AdapterServer:
    proc: object
    url: str
    key: str | None
    log: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}


def adapter_flags(names: list[str]) -> list[str]:
    return [arg for name in names for arg in ("--adapter", f"{name}=run-{name}")]


@contextmanager
def adapter_server(runs: AdapterRuns, work: Path, names: list[str], key: str | None = "adapter-test-key",
                   extra_env: dict[str, str] | None = None) -> Iterator[AdapterServer]:
    """`python -m workloads.serve.launch` serving the base and `names` (stored runs) from one engine process."""
    work.mkdir(parents=True, exist_ok=True)
    proc, url, log = start_server(runs.run, work, key, adapter_flags(names), timeout_s=300, env=extra_env)
    try:
        yield AdapterServer(proc, url, key, log)
    finally:
        stop_server(proc)
