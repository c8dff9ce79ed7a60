"""A small real run for evaluation and serving tests: SmolLM2 base, a test split, a LoRA adapter and its merge.

The adapter comes from a short real LoRA training run (AdamW steps on the train split), so the fine-tuned
model's assistant-token perplexity on the held-out split is expected to be lower than the base's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from file_lock import exclusive

from documents.run_config import RunConfig, parse_run_config
from serve_process import start_launcher, stop_launcher

ROOT = Path(__file__).resolve().parent.parent


def train_adapter(base_dir: Path, train_dir: Path, adapter_dir: Path, merged_dir: Path | None, steps: int,
                  rank: int = 8, seed: int = 0) -> None:
    """A short real LoRA run (AdamW on assistant-only labels), then the adapter is saved and, given a folder, merged
    by workloads.train.export."""
    import torch
    from datasets import load_from_disk
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from workloads.train.export import merge_adapter

    torch.manual_seed(seed)
    data = load_from_disk(str(train_dir))
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    batch = 4
    model.train()
    for step in range(steps):
        rows = [data[(step * batch + i) % len(data)] for i in range(batch)]
        width = max(len(r["input_ids"]) for r in rows)
        pad = [width - len(r["input_ids"]) for r in rows]
        ids = torch.tensor([r["input_ids"] + [0] * p for r, p in zip(rows, pad)])
        mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * p for r, p in zip(rows, pad)])
        labels = torch.tensor([r["labels"] + [-100] * p for r, p in zip(rows, pad)])
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        optim.step()
        optim.zero_grad()
    model.save_pretrained(adapter_dir)
    if merged_dir is not None:
        merge_adapter(adapter_dir, base_dir, merged_dir)


def eval_run_config(root: Path, base: Path) -> RunConfig:
    """The run config of the evaluation and serving tests' run under `root` (SmolLM2 + 48 synthetic conversations)."""
    return parse_run_config({
        "name": "evaltest",
        "paths": {"root": str(root)},
        "model": {"source": f"dir:{base}"},
        # truncate: at 128 tokens many synthetic answers are longer than the limit; cutting them keeps the rows
        "data": {"source": "sample", "rows": 48, "seed": 0, "max_length": 128, "overlong": "truncate"},
        "eval": {"num_prompts": 3, "num_samples": 2, "max_new_tokens": 16, "batch_size": 8,
                 "device": "cpu", "dtype": "float32"},
        "serve": {"engine": "transformers", "device": "cpu", "dtype": "float32", "cb_num_blocks": 16,
                  "cb_max_batch_tokens": 1024},
    }, "eval_fixtures")


def make_run(root: Path, base: Path, steps: int = 10) -> RunConfig:
    """A run under `root`: prepare stage, then a short LoRA run."""
    from workloads.prepare import run as prepare

    run = eval_run_config(root, base)
    prepare(run)
    train_adapter(run.base_model_dir, run.train_tokenized_dir, run.adapter_dir, run.merged_dir, steps)
    return run


COMPLETE = ".trained"
"""in the shared run's folder once it is whole"""


@pytest.fixture(scope="session")
def trained_run(smollm2_base_dir: Path, tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> RunConfig:
    """Trained once per session: under xdist by the first worker that asks, in the session's shared temp folder
    (the local Slurm's worker and the trained-run worker both use it). Each worker gets its own copy of the run's
    tree made of hard links: every writer of a run file (reports, served sets, manifests) writes a temporary file
    and renames it, so a worker's writes stay its own."""
    own = tmp_path_factory.mktemp("evalrun")
    if worker_id == "master":
        return make_run(own, smollm2_base_dir)
    shared = tmp_path_factory.getbasetemp().parent / "evalrun-shared"
    with exclusive(shared.with_name(shared.name + ".lock")):
        if not (shared / COMPLETE).is_file():
            shutil.rmtree(shared, ignore_errors=True)
            make_run(shared, smollm2_base_dir)
            (shared / COMPLETE).touch()
    shutil.copytree(shared, own, copy_function=os.link, dirs_exist_ok=True, ignore=shutil.ignore_patterns(COMPLETE))
    return eval_run_config(own, smollm2_base_dir)


@dataclass
class Served:
    api: str
    api_key: str
    run: RunConfig
    log: Path


def start_server(run: RunConfig, work: Path, api_key: str | None, extra: list[str] | None = None,
                 timeout_s: float = 600.0, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, Path]:
    """`python -m workloads.serve.launcher.launch` as a real process; returns it once /health answers 200."""
    config = work / "run.json"
    config.write_text(run.model_dump_json())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    env.pop("FT_API_KEY", None)
    if api_key:
        env["FT_API_KEY"] = api_key
    log = work / "serve.log"
    proc, url = start_launcher(config, extra or [], env, log, timeout_s, cwd=ROOT)
    return proc, url, log


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher as Slurm would; it must stop its engine processes before exiting."""
    engines = children(proc.pid)
    stop_launcher(proc)
    left = [pid for pid in engines if Path(f"/proc/{pid}").exists()]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"engine processes {left} outlived the launcher"


@pytest.fixture(scope="session")
def served(trained_run: RunConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The gateway with base and merged fine-tuned model (transformers serve, continuous batching), API key set."""
    key = "test-" + os.urandom(8).hex()
    proc, url, log = start_server(trained_run, tmp_path_factory.mktemp("serve"), key)
    try:
        yield Served(f"{url}/v1", key, trained_run, log)
    finally:
        stop_server(proc)
