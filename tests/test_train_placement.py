"""One decision, one order: `ftstack plan`, the preview's model-fits policy and the trainer place the shipped 70B
run configs identically (strategy, nodes, ranks, shards, micro-batch, accumulation, checkpointing) on the h100
stack's 2 x 8 H100s at the memory PyTorch reports for an H100 (79.19 GiB, measured; docs/training.md). The node's
RAM each counts host memory against is its own: the preset's (1,600 GiB) before the run, the machine's in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import load_stack_config
from infra.cost.training import load_run
from infra.model_fit import worker_fits
from policies import rules
from policies.rules import Context
from workloads.train.model_shapes import shape_for_source

ROOT = Path(__file__).resolve().parent.parent
H100_REPORTED_GIB = 79.19
# meta-llama/Llama-3.1-70B config.json, as published
LLAMA70_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
                  "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
                  "intermediate_size": 28672, "vocab_size": 128256, "tie_word_embeddings": False}


def _stack(config: str):
    cfg = load_stack_config("h100", ROOT / "stacks")
    return cfg.model_copy(update={"pipeline": cfg.pipeline.model_copy(update={"run_config": config})})


@pytest.mark.parametrize(("config", "strategy"), [("workloads/configs/h100-llama-3.1-70b-lora.json", "fsdp"),
                                                  ("workloads/configs/h100-llama-3.1-70b-qlora.json", "ddp")])
def test_plan_policy_and_trainer_place_the_shipped_70b_runs_alike(config, strategy, tmp_path, monkeypatch):
    from workloads.train import finetune

    cfg = _stack(config)
    run = load_run(cfg, ROOT)
    [fit] = worker_fits(cfg, run, shape_for_source(run.model.source))
    policy = fit.placement.model_dump(mode="json")
    assert rules.model_fits(Context([], cfg, run, {})) == []

    proc = subprocess.run([sys.executable, "-m", "infra.commands.cli", "plan", "--stack", "h100", "--run-config",
                           config, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [planned] = json.loads(proc.stdout)["placement"]

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA70_CONFIG))
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setattr(finetune, "gpu_memory_gib", lambda: H100_REPORTED_GIB)  # no GPU here: what torch reports
    trainer = finetune.job_placement(run, model).model_dump(mode="json")

    ram = {placement.pop("host_memory_gib") for placement in (planned["placement"], policy, trainer)}
    assert ram == {1600, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30}  # preset's, this machine's
    assert planned["placement"] == policy == trainer
    assert (trainer["nodes"], trainer["gpus_per_node"], trainer["plan"]["strategy"]) == (2, 8, strategy)
    assert trainer["plan"]["fits"] and trainer["batches"] is not None
