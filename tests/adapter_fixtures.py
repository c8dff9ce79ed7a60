"""Stored runs with LoRA adapters of the tiny model (adapter_runs.py), and a server that serves them from one
process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from adapter_runs import STACK, register_run, save_adapter
from eval_fixtures import start_server, stop_server

from documents.run_config import RunConfig, parse_run_config
from infra.runs.store import LocalStore

ADAPTERS = {"desk-earnings": 4, "desk-credit": 8, "desk-filings": 12}
"""name -> LoRA rank; the run id is `run-<name>`."""
SPARE = "desk-spare"


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
                  "stack": STACK, "max_tokens_limit": 256},
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
    """`python -m workloads.serve.launcher.launch` serving the base and `names` (stored runs) from one engine process."""
    work.mkdir(parents=True, exist_ok=True)
    proc, url, log = start_server(runs.run, work, key, adapter_flags(names), timeout_s=300, env=extra_env)
    try:
        yield AdapterServer(proc, url, key, log)
    finally:
        stop_server(proc)
