"""`serve.engine: auto` on a GPU stack picks vLLM from the serving environment the chain hands the serve job
($FT_VLLM_PYTHON, issue 53), and peft where that environment holds no vLLM or the node has no GPU. The serving
environment here is the real one, `.venv-vllm` (vLLM's CPU build, made by `make vllm-venv`); only the GPU's
presence is stood in for, since this machine has none."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from documents.run_config import load_run_config
from workloads.serve.launcher.engine_plan import choose_engine
from workloads.serve.launcher.launch import merged_serve_config, parse_args

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CONFIG = ROOT / "workloads" / "configs" / "h100.json"


def engine(monkeypatch: pytest.MonkeyPatch, vllm_python: str | None, gpu: bool) -> str:
    if vllm_python is None:
        monkeypatch.delenv("FT_VLLM_PYTHON", raising=False)
    else:
        monkeypatch.setenv("FT_VLLM_PYTHON", vllm_python)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    cfg = merged_serve_config(load_run_config(CONFIG), parse_args(["--config", str(CONFIG)]))
    assert cfg.engine == "auto"
    return choose_engine(cfg)


def test_auto_serves_with_vllm_from_the_serving_environment_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert VLLM_PYTHON.exists(), "make vllm-venv"
    assert engine(monkeypatch, str(VLLM_PYTHON), gpu=True) == "vllm"


def test_auto_falls_back_to_peft_without_a_serving_environment_or_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert engine(monkeypatch, None, gpu=True) == "peft", "the workloads' environment holds no vLLM"
    assert engine(monkeypatch, str(VLLM_PYTHON), gpu=False) == "peft"
