"""The whole local pipeline, as `make demo` runs it but smaller: ftstack run on the real stages
(prepare, readiness, QLoRA training with 2 DDP processes, export, evaluation) through the local Slurm."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from documents.evaluator_report import EvaluatorReport, read_evaluator_report
from documents.metrics import read_metrics
from documents.run_manifest import read_run_manifest
from infra.runs.store import list_runs, local_store, read_run_file

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


def small_config(root: Path, base: Path) -> dict:
    config = json.loads((REPO / "workloads/configs/local.json").read_text())
    config["name"] = "e2e"
    config["paths"]["root"] = str(root)
    config["model"] = {"source": f"dir:{base}"}
    config["data"].update(rows=160, max_length=256)
    config["train"].update(max_steps=2, save_steps=1, logging_steps=1)
    config["eval"].update(perplexity_rows=8, num_prompts=2, num_samples=1, max_new_tokens=16)
    return config


def test_local_pipeline_end_to_end(slurm: str, smollm2_base_dir: Path, tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    config_file = tmp_path / "e2e.json"
    config_file.write_text(json.dumps(small_config(tmp_path / "work", smollm2_base_dir)))
    (stacks / "Pulumi.e2e.yaml").write_text(
        "config:\n  soperator-finetune:target: local\n  soperator-finetune:clusterName: e2e\n"
        f"  soperator-finetune:pipeline:\n    runConfig: {config_file}\n"
    )
    ftstack = [str(Path(sys.executable).with_name("ftstack")), "run", "--stack", "e2e", "--config-dir", str(stacks)]
    state = REPO / ".local/pipeline/e2e.json"
    state.unlink(missing_ok=True)
    store = local_store(REPO)
    shutil.rmtree(store.root / "runs" / "e2e", ignore_errors=True)

    first = subprocess.run([*ftstack, "--wait", "--json"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert first.returncode == 0, first.stderr[-3000:]
    run = json.loads(first.stdout)
    assert run["submitted"] == ["prepare", "readiness", "train", "eval"]
    assert {job["state"] for job in run["jobs"].values()} == {"COMPLETED"}
    assert "step 2 loss" in first.stderr
    evaluation = EvaluatorReport.model_validate(run["evaluation"])
    assert evaluation.finetuned_kind == "merged" and evaluation.job_id == run["jobs"]["eval"]["job_id"]
    outputs = json.loads((REPO / ".local/pipeline/e2e-outputs.json").read_text())
    assert outputs["eval_perplexity_base"] == evaluation.base_model.perplexity
    assert outputs["eval_tokens_per_second_finetuned"] == evaluation.finetuned_model.tokens_per_second > 0
    assert all(isinstance(outputs[f"pipeline_{stage}_elapsed_s"], int) for stage in run["jobs"])
    assert outputs["pipeline_train_state"] == "COMPLETED"

    [stored] = list_runs(store, "e2e")
    assert stored.job_ids == {stage: job["job_id"] for stage, job in run["jobs"].items()}
    eval_name = f"eval/evaluator_{evaluation.job_id}.json"
    assert set(stored.files) == {"config/e2e.json", "train/metrics.jsonl", "train/run_manifest.json", "train/loss.png",
                                 eval_name, eval_name.replace(".json", ".png"), "outputs.json",
                                 # PEFT's two adapter files, kept so serving loads only the store's hashed copy
                                 "adapter/adapter_config.json", "adapter/adapter_model.safetensors"}
    assert read_evaluator_report(read_run_file(store, "e2e", stored.run_id, eval_name), eval_name) == evaluation
    manifest = read_run_manifest(read_run_file(store, "e2e", stored.run_id, "train/run_manifest.json"), "manifest")
    assert manifest.status == "completed" and manifest.global_step == 2 and manifest.world_size == 2
    records = read_metrics(read_run_file(store, "e2e", stored.run_id, "train/metrics.jsonl"), "metrics")
    assert [r.step for r in records if r.loss is not None] == [1, 2]
    assert stored.train_loss_final == [r.loss for r in records if r.loss is not None][-1] and stored.perplexity_base == evaluation.base_model.perplexity
    assert json.loads(read_run_file(store, "e2e", stored.run_id, "outputs.json")) == outputs
    assert (tmp_path / "work/outputs/e2e/merged/model.safetensors").is_file()
    assert (tmp_path / "work/outputs/e2e/adapter/adapter_model.safetensors").is_file()

    second = subprocess.run([*ftstack, "--wait", "--json"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads(second.stdout)
    assert again["submitted"] == [] and EvaluatorReport.model_validate(again["evaluation"]) == evaluation
    assert len(list_runs(store, "e2e")) == 1, "an unchanged run is stored once"
    state.unlink(missing_ok=True)
    shutil.rmtree(store.root / "runs" / "e2e", ignore_errors=True)
