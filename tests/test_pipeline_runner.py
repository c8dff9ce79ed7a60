"""`ftstack run`'s engine against the real local Slurm, on a stand-in bundle whose stages take a second.

The stages here only record that they ran (the real ones train a model); what is under test is the
orchestration: order, failure stopping the chain, nothing resubmitted when nothing changed, and a
changed train section resubmitting train and eval but not prepare.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from document_fixtures import evaluator_report, side

from infra.config import PipelineConfig, StackConfig
from infra.pipeline.runner import load_state, run_pipeline, state_path, status
from infra.pipeline.slurm import SlurmJobFailed

pytestmark = pytest.mark.slurm

STAGE = """#!/usr/bin/env bash
set -euo pipefail
config="$(realpath "$1")"
root="${{FT_ROOT}}"
mkdir -p "$root/ran"
echo "$SLURM_JOB_ID" >> "$root/ran/{stage}"
{body}
"""
EVAL_BODY = f"""cat > "$root/results/evaluator_$SLURM_JOB_ID.json" <<'JSON'
{evaluator_report("stand-in", side(3.0, 10.0), side(2.0, 10.0)).model_dump_json()}
JSON"""


def make_repo(root: Path, fail: str | None = None) -> Path:
    jobs = root / "workloads" / "jobs"
    jobs.mkdir(parents=True)
    (root / "workloads" / "configs").mkdir()
    (root / "workloads" / "__init__.py").write_text("")
    (root / "documents").mkdir()
    (root / "documents" / "__init__.py").write_text("")
    (root / "planning").mkdir()
    (root / "planning" / "__init__.py").write_text("")
    for stage in ("prepare", "readiness", "train", "eval"):
        body = EVAL_BODY if stage == "eval" else ""
        if stage == fail:
            body = 'echo "stage broke on purpose: missing column user" >&2; exit 3'
        (jobs / f"{stage}.sbatch").write_text(STAGE.format(stage=stage, body=body))
    write_config(root, learning_rate=1e-4)
    return root


def write_config(root: Path, **train: float) -> None:
    config = {
        "name": "t", "paths": {"root": "work"}, "model": {"source": "dir:/nonexistent"},
        "data": {"source": "sample", "rows": 10}, "train": train,
    }
    (root / "workloads" / "configs" / "t.json").write_text(json.dumps(config))


def stack() -> StackConfig:
    return StackConfig(stack="t", target="local", pipeline=PipelineConfig(run_config="workloads/configs/t.json"))


def ran(root: Path, stage: str) -> list[str]:
    path = root / "work" / "ran" / stage
    return path.read_text().split() if path.exists() else []


def test_chain_runs_in_order_then_a_second_run_submits_nothing(slurm: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    (repo / "work" / "results").mkdir(parents=True)
    first = run_pipeline(stack(), repo, {"kind": "local"}, wait=True, progress=lambda _: None)
    assert first.submitted == ["prepare", "readiness", "train", "eval"]
    assert all(job["state"] == "COMPLETED" for job in first.jobs.values())
    ids = [int(first.jobs[s]["job_id"]) for s in ("prepare", "readiness", "train", "eval")]
    assert ids == sorted(ids) and [ran(repo, s) for s in first.jobs] == [[str(i)] for i in ids]
    assert first.evaluation.finetuned_model.perplexity == 2.0 and first.evaluation.base_model.perplexity == 3.0

    second = run_pipeline(stack(), repo, {"kind": "local"}, wait=True, progress=lambda _: None)
    assert second.submitted == [] and second.kept == ["prepare", "readiness", "train", "eval"]
    assert all(len(ran(repo, s)) == 1 for s in first.jobs)
    assert {s: j["state"] for s, j in status(stack(), repo, {"kind": "local"}).items()} == {
        s: "COMPLETED" for s in first.jobs}

    write_config(repo, learning_rate=2e-4)
    third = run_pipeline(stack(), repo, {"kind": "local"}, wait=True, progress=lambda _: None)
    assert third.submitted == ["train", "eval"] and third.kept == ["prepare", "readiness"]
    assert len(ran(repo, "prepare")) == 1 and len(ran(repo, "train")) == 2
    assert third.jobs["prepare"]["job_id"] == first.jobs["prepare"]["job_id"]


def test_failing_prepare_stops_the_chain_with_its_log(slurm: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path, fail="prepare")
    with pytest.raises(SlurmJobFailed) as failure:
        run_pipeline(stack(), repo, {"kind": "local"}, wait=True, progress=lambda _: None)
    message = str(failure.value)
    assert "missing column user" in message and "exit" in message.lower()
    assert all(ran(repo, s) == [] for s in ("readiness", "train", "eval"))
    state = load_state(state_path(repo, "t"), "t")
    assert state.stages["prepare"].outs["state"] == "FAILED"
    assert {state.stages[s].outs["state"] for s in ("readiness", "train", "eval")} == {"CANCELLED"}


def test_replaced_data_file_reruns_prepare_and_after_and_an_unchanged_one_submits_nothing(
        slurm: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    (repo / "work" / "results").mkdir(parents=True)
    config = json.loads((repo / "workloads" / "configs" / "t.json").read_text())
    config["data"] = {"source": "file:data/qa.jsonl"}
    (repo / "workloads" / "configs" / "t.json").write_text(json.dumps(config))
    data = repo / "work" / "data" / "qa.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text('{"user": "What was revenue in 2021?", "assistant": "$5 million"}\n')
    first = run_pipeline(stack(), repo, {"kind": "local"}, wait=True, progress=lambda _: None)
    assert first.submitted == ["prepare", "readiness", "train", "eval"]
    recorded = load_state(state_path(repo, "t"), "t").data_source
    assert recorded.path == str(data) and recorded.size == data.stat().st_size
    assert recorded.sha256 == hashlib.sha256(data.read_bytes()).hexdigest()

    data.write_text(data.read_text())  # rewritten with the same bytes: a new mtime, the same content
    same = run_pipeline(stack(), repo, {"kind": "local"}, wait=True, progress=lambda _: None)
    assert same.submitted == [] and len(ran(repo, "prepare")) == 1

    data.write_text('{"user": "What was revenue in 2022?", "assistant": "$6 million"}\n')
    replaced = run_pipeline(stack(), repo, {"kind": "local"}, wait=True, progress=lambda _: None)
    assert replaced.submitted == ["prepare", "readiness", "train", "eval"]
    assert [len(ran(repo, s)) for s in ("prepare", "readiness", "train", "eval")] == [2, 2, 2, 2]

    data.unlink()
    with pytest.raises(ValueError, match=r"data source file:data/qa.jsonl: cannot read .*qa.jsonl"):
        run_pipeline(stack(), repo, {"kind": "local"}, wait=False, progress=lambda _: None)


def test_relative_run_config_outside_workloads_is_refused_before_submission(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    (repo / "configs").mkdir()
    (repo / "configs" / "t.json").write_text((repo / "workloads" / "configs" / "t.json").read_text())
    outside = StackConfig(stack="t", target="local", pipeline=PipelineConfig(run_config="configs/t.json"))
    with pytest.raises(ValueError, match=r"run config 'configs/t.json' is outside workloads/.*workloads/configs/"):
        run_pipeline(outside, repo, {"kind": "local"}, wait=False, progress=lambda _: None)
    assert not state_path(repo, "t").exists()
