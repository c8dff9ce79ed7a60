"""Sharded training (FSDP2) on CPU: 2 ranks over gloo, the tiny model, the same rows and seed as DDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from eval_fixtures import start_server, stop_server
from safetensors import safe_open
from train_fixtures import LOSS_REL_TOL, ROOT, trained, with_train, write_config

from documents.run_config import RunConfig, parse_run_config

pytestmark = pytest.mark.slow

STEPS = 20


def pair(tiny_prepared: RunConfig, tmp_path: Path, **train: Any) -> tuple[RunConfig, RunConfig]:
    common = {"max_steps": STEPS, "save_steps": 100, "micro_batch_size": 1, "batching": "grouped",
              "learning_rate": 1e-3, "precision": "fp32", **train}
    return (with_train(tiny_prepared, tmp_path / "ddp", parallelism="ddp", **common),
            with_train(tiny_prepared, tmp_path / "fsdp", parallelism="fsdp", **common))


@dataclass
class TrainedPair:
    """A DDP and an FSDP run of one method on the same rows, trained to the end: losses and manifests."""

    fsdp_run: RunConfig
    ddp: list[float]
    ddp_manifest: dict[str, Any]
    fsdp: list[float]
    fsdp_manifest: dict[str, Any]


@pytest.fixture(scope="module")
def trained_pair(tiny_prepared: RunConfig, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TrainedPair]:
    """Each method's pair trained once for the module: the parity test reads both runs, the offload test holds its
    offloaded run against the same FSDP run (one torchrun fewer). Exports in files of at most 1 MB."""
    pairs: dict[str, TrainedPair] = {}

    def get(method: str) -> TrainedPair:
        if method not in pairs:
            folder = tmp_path_factory.mktemp(f"pair-{method}")
            ddp_run, fsdp_run = pair(tiny_prepared, folder, method=method)
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("FT_SAVE_SHARD_BYTES", str(1024**2))
                pairs[method] = TrainedPair(fsdp_run, *trained(ddp_run, folder, "ddp"), *trained(fsdp_run, folder, "fsdp"))
        return pairs[method]

    return get


def _tensor_bytes(files: list[Path]) -> dict[str, int]:
    sizes = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                tensor = handle.get_tensor(key)
                sizes[key] = tensor.numel() * tensor.element_size()
    return sizes


@pytest.mark.parametrize("method", ["lora", "full"])
def test_fsdp_and_ddp_give_the_same_loss_curve_and_fsdp_holds_half_the_parameters(
        trained_pair: Callable[[str], TrainedPair], method: str) -> None:
    """Rank 1 builds the model on the meta device and gets its shards from rank 0 (sharding.shard_from_rank0);
    the result is written without gathering the model: an adapter's trainable weights only, a full fine-tune's
    weights streamed into files of at most 1 MB (each over-sized tensor alone in its file)."""
    runs = trained_pair(method)
    fsdp_run, ddp, ddp_manifest, fsdp, fsdp_manifest = (runs.fsdp_run, runs.ddp, runs.ddp_manifest, runs.fsdp,
                                                        runs.fsdp_manifest)
    assert len(ddp) == len(fsdp) == STEPS
    assert fsdp[0] == ddp[0]
    for step, (a, b) in enumerate(zip(ddp, fsdp), start=1):
        assert b == pytest.approx(a, rel=LOSS_REL_TOL), f"step {step}: ddp {a} fsdp {b}"
    assert (ddp_manifest["parallelism"]["strategy"], fsdp_manifest["parallelism"]["strategy"]) == ("ddp", "fsdp")
    assert fsdp_manifest["parallelism"]["shards"] == 2 and fsdp_manifest["world_size"] == 2
    held = "trainable" if method == "full" else "frozen"
    whole, shard = ddp_manifest["parameter_bytes"][held], fsdp_manifest["parameter_bytes"][held]
    assert shard == pytest.approx(whole / 2, rel=0.01), (shard, whole)
    if method == "full":  # the estimate's sharded fp32 masters against the shards rank 0 held
        assert fsdp_manifest["parallelism"]["per_rank_bytes"]["trainable_weights"] == shard
    output = fsdp_run.train_run_dir / ("model" if method == "full" else "adapter")
    assert fsdp_manifest[("model" if method == "full" else "adapter")] == str(output)
    saved = _tensor_bytes(sorted(output.glob("*.safetensors")))
    peak = fsdp_manifest["export_peak_bytes"]
    if method == "lora":  # what was gathered is the adapter, every byte of it, and none of the base
        assert peak == sum(saved.values()) == ddp_manifest["parameter_bytes"]["trainable"]
        assert peak < ddp_manifest["parameter_bytes"]["frozen"] / 10
    else:  # several files; rank 0 never held more than the largest tensor (files of <= 1 MB, else one tensor)
        assert len(list(output.glob("model-*.safetensors"))) > 1 and (output / "model.safetensors.index.json").is_file()
        assert peak == max(saved.values()) < sum(saved.values())
        assert sum(saved.values()) == whole  # every fp32 weight, the tied LM head once


def test_qlora_shards_its_4bit_base_on_cpu(tiny_prepared: RunConfig, tmp_path: Path) -> None:
    """bitsandbytes' NF4 weights stored in the compute dtype (fp32 on CPU) are ordinary floating tensors to FSDP:
    each rank keeps half of every packed weight, and training matches DDP's (with activation checkpointing, as the
    shipped QLoRA configs train)."""
    ddp_run, fsdp_run = pair(tiny_prepared, tmp_path, quantization="4bit", max_steps=4, gradient_checkpointing=True)
    ddp, ddp_manifest = trained(ddp_run, tmp_path, "ddp")
    fsdp, fsdp_manifest = trained(fsdp_run, tmp_path, "fsdp")
    assert fsdp_manifest["parallelism"]["method"] == "qlora" and fsdp_manifest["parallelism"]["strategy"] == "fsdp"
    whole, shard = ddp_manifest["parameter_bytes"]["frozen"], fsdp_manifest["parameter_bytes"]["frozen"]
    assert shard == pytest.approx(whole / 2, rel=0.01), (shard, whole)
    assert fsdp == pytest.approx(ddp, rel=LOSS_REL_TOL)
    assert fsdp_manifest["batch_plan"]["gradient_checkpointing"] is True
    assert (fsdp_run.adapter_dir / "adapter_model.safetensors").is_file()


def test_a_sharded_checkpoint_resumes_on_more_ranks_and_is_refused_on_one(
        tiny_prepared: RunConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torch.distributed.checkpoint reshards the 2-rank weights and Adam states over 3 ranks; one process cannot
    shard, so it refuses the FSDP checkpoint and says what to set."""
    from workloads.train.finetune import main

    common = {"save_steps": 2, "micro_batch_size": 1, "batching": "grouped", "parallelism": "fsdp"}
    first = with_train(tiny_prepared, tmp_path, max_steps=4, **common)
    trained(first, tmp_path, "two")
    more = with_train(tiny_prepared, tmp_path, max_steps=6, **common)
    losses, manifest = trained(more, tmp_path, "three", nproc=3)
    assert "written by 2 ranks, resuming on 3" in (tmp_path / "three.log").read_text()
    assert [a["resumed_from_step"] for a in manifest["attempts"]] == [4] and manifest["world_size"] == 3
    assert len(losses) == 6 and manifest["status"] == "completed"
    alone = with_train(tiny_prepared, tmp_path, max_steps=8, **common)
    assert main(["--config", str(write_config(alone, tmp_path / "one.json"))]) == 2
    error = capsys.readouterr().err
    assert "written under fsdp and this run trains under ddp" in error and "needs 2 or more ranks" in error


@pytest.mark.parametrize("method", ["full"])
def test_cpu_offload_trains_to_the_losses_of_no_offload(tiny_prepared: RunConfig, tmp_path: Path,
                                                        trained_pair: Callable[[str], TrainedPair], method: str) -> None:
    """FSDP2's CPUOffloadPolicy (train.offload: params) keeps the shards, gradients and Adam states in host memory
    and steps the optimizer there: the same numbers as keeping them on the device (on CPU both are host memory,
    so this checks the offloaded path's arithmetic, not its speed). Held against the parity test's FSDP run: the
    same settings, offload left to auto, which is none on CPU."""
    plain = trained_pair(method)
    _, fsdp_run = pair(tiny_prepared, tmp_path, method=method, offload="params")
    offloaded, manifest = trained(fsdp_run, tmp_path, "offload")
    assert (plain.fsdp_manifest["parallelism"]["offload"], manifest["parallelism"]["offload"]) == ("none", "params")
    assert manifest["parallelism"]["strategy"] == "fsdp" and len(offloaded) == STEPS
    assert offloaded == pytest.approx(plain.fsdp, rel=LOSS_REL_TOL)


def test_hsdp_over_2_replicas_of_2_shards_trains_as_ddp_holds_half_and_resumes(
        tiny_prepared: RunConfig, tmp_path: Path) -> None:
    """4 ranks as HSDP (train.hsdp_shard_size 2: a 2 x 2 DeviceMesh) against 4 ranks of DDP on the same rows and
    seed: the same losses; each rank holds half the frozen base (its shard group's 2 shards; FSDP over the 4 would
    hold a quarter); the adapter gathered alone; and a checkpoint written under HSDP resumes under HSDP to the
    losses DDP reached without stopping (constant learning rate, so the shorter first run's schedule is the same)."""
    common = {"save_steps": 2, "micro_batch_size": 1, "batching": "grouped", "learning_rate": 1e-3,
              "lr_scheduler": "constant", "precision": "fp32"}
    hsdp = {"parallelism": "hsdp", "hsdp_shard_size": 2, **common}
    ddp, ddp_manifest = trained(with_train(tiny_prepared, tmp_path / "ddp", parallelism="ddp", max_steps=6,
                                           **common), tmp_path, "ddp", nproc=4)
    first, first_manifest = trained(with_train(tiny_prepared, tmp_path / "hsdp", max_steps=4, **hsdp), tmp_path,
                                    "hsdp4", nproc=4)
    assert first == pytest.approx(ddp[:4], rel=LOSS_REL_TOL)
    layout = first_manifest["parallelism"]
    assert (layout["strategy"], layout["shards"], layout["replicas"], first_manifest["world_size"]) == ("hsdp", 2, 2, 4)
    whole, held = ddp_manifest["parameter_bytes"]["frozen"], first_manifest["parameter_bytes"]["frozen"]
    assert held == pytest.approx(whole / 2, rel=0.01), (held, whole)
    run = with_train(tiny_prepared, tmp_path / "hsdp", max_steps=6, **hsdp)
    resumed, manifest = trained(run, tmp_path, "hsdp6", nproc=4)
    assert [a["resumed_from_step"] for a in manifest["attempts"]] == [4] and manifest["status"] == "completed"
    assert len(resumed) == len(ddp) == 6
    assert resumed == pytest.approx(ddp, rel=LOSS_REL_TOL)
    saved = _tensor_bytes(sorted(run.adapter_dir.glob("*.safetensors")))
    assert manifest["export_peak_bytes"] == sum(saved.values()) == ddp_manifest["parameter_bytes"]["trainable"]


def test_an_hsdp_shard_size_that_does_not_divide_the_ranks_is_refused_naming_both(
        tiny_prepared: RunConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workloads.train.finetune import main

    run = with_train(tiny_prepared, tmp_path, parallelism="hsdp", hsdp_shard_size=3)
    assert main(["--config", str(write_config(run, tmp_path / "hsdp.json"))]) == 2
    assert "train.hsdp_shard_size 3 does not divide the world size of 1 ranks" in capsys.readouterr().err


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
def test_eval_and_serve_load_what_fsdp_trained(tiny_prepared: RunConfig, trained_pair: Callable[[str], TrainedPair],
                                               tmp_path: Path, method: str, finetuned: str) -> None:
    """What FSDP training leaves is ordinary: the adapter in PEFT's layout (the evaluator loads it as an adapter,
    export merges it) and a full fine-tune's model folder, here in files of at most 1 MB (exported, evaluated and
    served by the gateway as a merged model). The parity test's FSDP runs."""
    pair_run = trained_pair(method)
    run, manifest = with_eval_and_serve(pair_run.fsdp_run, tiny_prepared, finetuned), pair_run.fsdp_manifest
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
