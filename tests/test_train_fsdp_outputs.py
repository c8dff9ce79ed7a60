"""What FSDP training leaves is ordinary: the adapter in PEFT's layout (the evaluator loads it as an adapter, export
merges it) and a full fine-tune's model folder (exported, evaluated and served by the gateway as a merged model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from eval_fixtures import start_server, stop_server
from safetensors import safe_open
from train_fixtures import ROOT, trained, with_train, write_config

from documents.run_config import RunConfig, parse_run_config

pytestmark = pytest.mark.slow


def with_eval_and_serve(run: RunConfig, prepared: RunConfig, finetuned: str) -> RunConfig:
    """`run` with eval and serve sections, reading the base model and the test split where `prepared` has them."""
    data = run.model_dump(mode="json")
    data["paths"] |= {"model_dir": str(prepared.model_dir), "data_dir": str(prepared.data_dir)}
    data["eval"] = {"num_prompts": 2, "num_samples": 1, "max_new_tokens": 8, "batch_size": 4, "device": "cpu",
                    "dtype": "float32", "perplexity_rows": 4, "finetuned": finetuned}
    data["serve"] = {"engine": "transformers", "device": "cpu", "dtype": "float32", "cb_num_blocks": 16,
                     "cb_max_batch_tokens": 1024}
    return parse_run_config(data, "with_eval_and_serve")


def run_module(module: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SLURM_JOB_ID": "29", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", module, "--config", str(config)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize(("method", "finetuned"), [("lora", "adapter"), ("full", "merged")])
def test_eval_and_serve_load_what_fsdp_trained(tiny_prepared: RunConfig, tmp_path: Path, method: str,
                                               finetuned: str) -> None:
    run = with_eval_and_serve(with_train(tiny_prepared, tmp_path, method=method, parallelism="fsdp", max_steps=4,
                                         save_steps=100, micro_batch_size=1, batching="grouped"),
                              tiny_prepared, finetuned)
    _, manifest = trained(run, tmp_path, "fsdp")
    assert manifest["parallelism"]["strategy"] == "fsdp" and manifest["status"] == "completed"
    if method == "lora":
        assert json.loads((run.adapter_dir / "adapter_config.json").read_text())["peft_type"] == "LORA"
        with safe_open(str(run.adapter_dir / "adapter_model.safetensors"), framework="pt") as handle:
            keys = list(handle.keys())
        assert keys and all("lora_" in k for k in keys)
    else:
        assert not run.adapter_dir.exists() and (run.locate().full_model_dir / "config.json").is_file()
    config = write_config(run, tmp_path / "run.json")
    exported = run_module("workloads.train.export", config)
    assert exported.returncode == 0, exported.stderr[-3000:]
    stage = json.loads((run.merged_dir / "manifest.json").read_text())
    assert (stage.get("adapter") is None) == (method == "full") and (stage.get("trained") is None) == (method == "lora")

    evaluated = run_module("workloads.eval.evaluate", config)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads(evaluated.stdout)
    assert report["finetuned_kind"] == finetuned and report["finetuned_model"]["perplexity"] > 1

    if method == "lora":  # the merged folder export made from it serves like every merged run's (test_serve_http.py)
        return
    proc, url, _ = start_server(run, tmp_path, None)
    try:
        body = {"model": "finetuned", "messages": [{"role": "user", "content": "What is a bond?"}], "max_tokens": 4}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    finally:
        stop_server(proc)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "finetuned"
