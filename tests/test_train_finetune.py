"""finetune.py on the tiny prepared run: outputs, config errors, stop/resume, corrupt checkpoints, 4-bit on CPU."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
from datasets import load_from_disk
from safetensors import safe_open

from train_fixtures import with_train, write_config
from documents.run_config import ConfigError, parse_run_config
from workloads.train import checkpoints
from workloads.train.config import resolve_precision, train_paths
from workloads.train.finetune import main, train_run
from workloads.train.launch import main as launch
from documents.run_manifest import RunManifest
from documents.run_plan import PLAN_ENV
from infra.config import load_stack_config
from infra.pipeline.chain import job_plan
from infra.plans import stack_plan
from documents.metrics import load_metrics
from workloads.train.preemption import INTERRUPTED_EXIT, STOP_FILE_ENV

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("train", "field"),
    [
        ({"quantization": "3bit"}, "train.quantization"),
        ({"lora": {"r": 0}}, "train.lora.r"),
        ({"learning_rate": -1}, "train.learning_rate"),
        ({"micro_batch_size": 0}, "train.micro_batch_size"),
        ({"precision": "fp8"}, "train.precision"),
        ({"save_every": 5}, "train.save_every"),
        ({"network": {"fabric": "ib"}}, "train.network.fabric"),
    ],
)
def test_bad_train_values_name_the_field(train: dict, field: str) -> None:
    data = {"name": "x", "model": {"source": "dir:/m"}, "data": {"source": "sample", "rows": 4}, "train": train}
    with pytest.raises(ConfigError) as error:
        parse_run_config(data, "run.json")
    assert str(error.value).startswith("run.json") and field in str(error.value)


def test_precision_auto_and_checks() -> None:
    """auto: bf16 wherever the device computes it natively (GPU or CPU), fp16 on older GPUs, fp32 on other CPUs;
    fp16 never on CPU, bf16 only where supported."""
    assert resolve_precision("auto", cuda=False, bf16_supported=False) == "fp32"
    assert resolve_precision("auto", cuda=False, bf16_supported=True) == "bf16"
    assert resolve_precision("auto", cuda=True, bf16_supported=True) == "bf16"
    assert resolve_precision("auto", cuda=True, bf16_supported=False) == "fp16"
    assert resolve_precision("bf16", cuda=False, bf16_supported=True) == "bf16"
    for precision, cuda, bf16 in (("bf16", False, False), ("fp16", False, True), ("bf16", True, False)):
        with pytest.raises(ValueError, match="train.precision"):
            resolve_precision(precision, cuda=cuda, bf16_supported=bf16)


def test_cli_without_train_section_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"name": "x", "model": {"source": "dir:/m"}, "data": {"source": "sample", "rows": 4}}))
    assert main(["--config", str(config)]) == 2
    assert "no 'train' section" in capsys.readouterr().err


def test_training_writes_adapter_metrics_plot_manifest(tiny_prepared, tmp_path: Path) -> None:
    run = with_train(tiny_prepared, tmp_path, max_steps=4, save_steps=1, save_total_limit=2, eval_steps=2,
                     batching="packed")
    assert train_run(run) == 0
    out = run.train_run_dir
    with safe_open(str(out / "adapter" / "adapter_model.safetensors"), framework="pt") as handle:
        assert any("lora_A" in key for key in handle.keys())
    rows = [r for r in load_metrics(out / "metrics.jsonl") if r.loss is not None]
    assert [r.step for r in rows] == [1, 2, 3, 4]
    for row in rows:
        assert row.loss > 0 and row.tokens_per_second > 0 and row.memory_mb > 0 and row.lr is not None
        assert row.padding_efficiency == round(row.tokens / 512, 4)  # every micro-batch is 2 x 256 tokens
        assert row.grad_norm is not None
    assert any(r.eval_loss is not None for r in load_metrics(out / "metrics.jsonl"))
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(line["version"] == 1 for line in lines) and "loss" not in next(l for l in lines if "eval_loss" in l)
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    manifest = json.loads((out / "run_manifest.json").read_text())
    assert RunManifest.model_validate(manifest).adapter == str(out / "adapter") and manifest["version"] == 1
    assert manifest["status"] == "completed" and manifest["global_step"] == 4 and manifest["world_size"] == 1
    assert len(manifest["config_sha256"]) == 64 and manifest["base_model"]["from"] == "prepare manifest"
    assert manifest["dataset"]["prepare_manifest_sha256"] and manifest["packages"]["peft"]
    assert manifest["started"] and manifest["ended"]
    assert manifest["attention"] == {"implementation": "sdpa", "backend": "default"}
    assert manifest["batch_plan"] | {"estimate_gib": None} == {
        "micro_batch_tokens": 512, "gradient_accumulation_steps": 1, "gradient_checkpointing": False,
        "step_tokens": 512, "estimate_gib": None, "gpu_memory_gib": None, "memory_fraction": 0.9, "source": "config"}
    assert manifest["fused_loss"] is False
    assert (manifest["batching"]["configured"], manifest["batching"]["chosen"]) == ("packed", "packed")
    kept = sorted(p.name for p in run.checkpoints_dir.iterdir())
    assert kept == ["checkpoint-3", "checkpoint-4"]
    assert all(checkpoints.problem(run.checkpoints_dir / k) is None for k in kept)
    assert train_run(run) == 0
    assert len(json.loads((out / "run_manifest.json").read_text())["attempts"]) == 1


def test_grouped_batching_pads_only_to_the_batch(tiny_prepared, tmp_path: Path) -> None:
    run = with_train(tiny_prepared, tmp_path, batching="grouped", max_steps=2, save_steps=5)
    assert train_run(run) == 0
    rows = load_metrics(run.train_run_dir / "metrics.jsonl")
    assert all(0.5 < r.padding_efficiency <= 1.0 for r in rows)


def test_auto_batching_trains_with_the_choice_it_records(tiny_prepared, tmp_path: Path) -> None:
    """`auto` decides from the train split's lengths, records the figures, and the micro-batches follow: packed
    ones are exactly 2 x 256 tokens, padded ones are 2 rows padded to the longer."""
    run = with_train(tiny_prepared, tmp_path, batching="auto", max_steps=2, save_steps=5)
    assert train_run(run) == 0
    decision = json.loads((run.train_run_dir / "run_manifest.json").read_text())["batching"]
    lengths = load_from_disk(str(tiny_prepared.train_tokenized_dir))["length"]
    assert decision["configured"] == "auto" and decision["rows"] == len(lengths) and decision["device"] == "cpu"
    cheaper = "packed" if decision["packed_cost"] < decision["padded_cost"] else "grouped"
    assert decision["chosen"] == cheaper and cheaper in decision["reason"]
    real = sum(min(n, 256) for n in lengths)
    assert 0.5 < decision["packed_fill"] <= round(real / (512 * math.ceil(real / 512)), 4)  # no fewer bins than that
    assert 0.0 < decision["padded_efficiency"] <= 1.0
    rows = [r for r in load_metrics(run.train_run_dir / "metrics.jsonl") if r.loss is not None]
    if cheaper == "packed":
        assert [r.padding_efficiency for r in rows] == [round(r.tokens / 512, 4) for r in rows]
    else:
        assert all(r.tokens <= 512 for r in rows)


def test_stop_then_resume_skips_corrupt_checkpoint(
    tiny_prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run = with_train(tiny_prepared, tmp_path, max_steps=5, save_steps=10)
    stop = tmp_path / "stop"
    stop.touch()
    monkeypatch.setenv(STOP_FILE_ENV, str(stop))
    assert train_run(run) == INTERRUPTED_EXIT
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == ["checkpoint-1"]
    assert json.loads((run.train_run_dir / "run_manifest.json").read_text())["status"] == "interrupted"
    assert launch(["--config", str(write_config(run, tmp_path / "run.json")), "--stopped"]) == 0
    stop.unlink()

    good = run.checkpoints_dir / "checkpoint-1"
    torn = run.checkpoints_dir / "checkpoint-3"
    torn.mkdir()
    (torn / "adapter_model.safetensors").write_bytes(b"\0" * 10)
    truncated = run.checkpoints_dir / "checkpoint-2"
    shutil.copytree(good, truncated)
    marker = json.loads((truncated / checkpoints.MARKER).read_text())
    marker["step"] = 2
    (truncated / checkpoints.MARKER).write_text(json.dumps(marker))
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])

    with caplog.at_level(logging.WARNING, logger="workloads.train.checkpoints"):
        assert train_run(run) == 0
    assert "checkpoint-3: no completion marker" in caplog.text
    assert "checkpoint-2: adapter_model.safetensors is 100 bytes" in caplog.text
    steps = [r.step for r in load_metrics(run.train_run_dir / "metrics.jsonl") if r.loss is not None]
    assert steps == [1, 2, 3, 4, 5]
    attempts = json.loads((run.train_run_dir / "run_manifest.json").read_text())["attempts"]
    assert [a["resumed_from_step"] for a in attempts] == [0, 1]


def test_4bit_nf4_trains_on_cpu(tiny_prepared, tmp_path: Path) -> None:
    import bitsandbytes as bnb

    from workloads.train import attention
    from workloads.train.finetune import load_model

    run = with_train(tiny_prepared, tmp_path, quantization="4bit", gradient_checkpointing=True, max_steps=2, save_steps=5)
    model = load_model(train_paths(run).model_dir, run.train, "fp32", 0, attention.choose(False, True), True)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert isinstance(layer.base_layer, bnb.nn.Linear4bit)
    assert layer.base_layer.weight.quant_state.quant_type == "nf4"
    assert train_run(run) == 0
    assert (run.adapter_dir / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("checkpointing", [True, False])
@pytest.mark.parametrize(("upcast", "stream"), [(False, "torch.bfloat16"), (True, "torch.float32")])
def test_4bit_frozen_weights_stay_in_the_compute_dtype_unless_upcast(tiny_prepared, tmp_path: Path, upcast: bool,
                                                                     stream: str, checkpointing: bool) -> None:
    """bf16 4-bit base (bitsandbytes on CPU) under bf16 autocast, as on a GPU: by default the norms and embeddings
    stay bf16 and so does every layer's output; `kbit_upcast` (peft's prepare_model_for_kbit_training) makes them
    fp32. Either way the LoRA weights are fp32 and get gradients, through checkpointed layers or without
    recomputation (what `auto` plans for 14B on an H100)."""
    import torch

    from workloads.train import attention
    from workloads.train.finetune import load_model

    run = with_train(tiny_prepared, tmp_path, quantization="4bit", kbit_upcast=upcast)
    model = load_model(train_paths(run).model_dir, run.train, "bf16", 0, attention.choose(False, True),
                       checkpointing)
    model.train()
    assert model.base_model.model.is_gradient_checkpointing == checkpointing
    inner = model.base_model.model.model
    assert str(inner.norm.weight.dtype) == stream and str(inner.embed_tokens.weight.dtype) == stream
    outputs: list[torch.dtype] = []
    inner.layers[-1].register_forward_hook(lambda _m, _i, out: outputs.append((out[0] if isinstance(out, tuple)
                                                                               else out).dtype))
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert str(outputs[0]) == stream
    lora = [p for n, p in model.named_parameters() if "lora_A" in n]
    assert lora and all(p.dtype == torch.float32 and p.grad is not None for p in lora)


def test_cli_runs_the_config_file(tiny_prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job trains with the plan it was submitted with (what the chain gives the train job) and its manifest
    records it; a job without one (sbatch by hand) makes its own with the same planner and records that."""
    run = with_train(tiny_prepared, tmp_path, max_steps=1, save_steps=1)
    given = job_plan(stack_plan(load_stack_config("local", ROOT / "stacks"), run))
    monkeypatch.setenv(PLAN_ENV, given.model_dump_json())
    assert main(["--config", str(write_config(run, tmp_path / "run.json"))]) == 0
    assert (run.adapter_dir / "adapter_config.json").is_file()
    manifest = RunManifest.model_validate_json((run.train_run_dir / "run_manifest.json").read_text())
    assert manifest.plan == given and manifest.plan.origin == "planned" and manifest.plan_differences == []
    monkeypatch.delenv(PLAN_ENV)
    again = with_train(tiny_prepared, tmp_path / "by-hand", max_steps=1, save_steps=1)
    assert main(["--config", str(write_config(again, tmp_path / "by-hand.json"))]) == 0
    made = RunManifest.model_validate_json((again.train_run_dir / "run_manifest.json").read_text()).plan
    assert made is not None and (made.origin, made.stack, made.run) == ("job", "sbatch", again.name)


def test_fused_loss_needs_cuda_and_says_so(tiny_prepared, tmp_path: Path) -> None:
    run = with_train(tiny_prepared, tmp_path, max_steps=1, fused_loss=True)
    with pytest.raises(RuntimeError, match="fused_loss needs a CUDA GPU and the liger-kernel package"):
        train_run(run)


def test_micro_batch_tokens_split_the_configured_global_batch(tiny_prepared, tmp_path: Path) -> None:
    """2 sequences x 2 accumulation x 256 tokens per step, as 4 packed micro-batches of 256, with activation
    checkpointing switched on on the model (not through TrainingArguments)."""
    run = with_train(tiny_prepared, tmp_path, max_steps=2, save_steps=5, gradient_accumulation_steps=2,
                     batching="packed", micro_batch_tokens=256, gradient_checkpointing=True)
    assert train_run(run) == 0
    manifest = json.loads((run.train_run_dir / "run_manifest.json").read_text())
    plan = manifest["batch_plan"]
    assert (plan["micro_batch_tokens"], plan["gradient_accumulation_steps"], plan["step_tokens"]) == (256, 4, 1024)
    assert plan["gradient_checkpointing"] is True
    rows = [r for r in load_metrics(run.train_run_dir / "metrics.jsonl") if r.loss is not None]
    assert [r.padding_efficiency for r in rows] == [round(r.tokens / 1024, 4) for r in rows]
