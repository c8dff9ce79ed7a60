"""The whole local pipeline, as `make demo` runs it but smaller: ftstack run on the real stages
(prepare, readiness, QLoRA training with 2 DDP processes, export, evaluation) through the local Slurm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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

    first = subprocess.run([*ftstack, "--wait", "--json"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert first.returncode == 0, first.stderr[-3000:]
    run = json.loads(first.stdout)
    assert run["submitted"] == ["prepare", "readiness", "train", "eval"]
    assert {job["state"] for job in run["jobs"].values()} == {"COMPLETED"}
    assert "step 2 loss" in first.stderr
    evaluation = run["evaluation"]
    assert all(value == value and value >= 0 for value in evaluation.values())
    outputs = json.loads((REPO / ".local/pipeline/e2e-outputs.json").read_text())
    assert outputs["eval_perplexity_base"] == evaluation["perplexity_base"]
    assert outputs["pipeline_train_state"] == "COMPLETED"
    report = json.loads(Path(run["jobs"]["eval"]["results_path"], f"evaluator_{run['jobs']['eval']['job_id']}.json")
                        .read_text())
    assert report["finetuned_kind"] == "merged"
    assert (tmp_path / "work/outputs/e2e/merged/model.safetensors").is_file()
    assert (tmp_path / "work/outputs/e2e/adapter/adapter_model.safetensors").is_file()

    second = subprocess.run([*ftstack, "--wait", "--json"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads(second.stdout)
    assert again["submitted"] == [] and again["evaluation"] == evaluation
    state.unlink(missing_ok=True)
