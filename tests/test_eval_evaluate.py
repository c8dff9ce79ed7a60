"""The evaluator CLI end to end on SmolLM2 after a short real LoRA training run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from eval_fixtures import ROOT

from documents.evaluator_report import Comparison, EvaluatorReport, SideReport
from workloads.eval.reuse import current_report, inputs_sha256

pytestmark = pytest.mark.slow


def _run_cli(config_path, job_id: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_JOB_ID": job_id, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "workloads.eval.evaluate", "--config", str(config_path), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )


@pytest.fixture(scope="module")
def report(trained_run, tmp_path_factory):
    config = tmp_path_factory.mktemp("evalcfg") / "run.json"
    config.write_text(trained_run.model_dump_json())
    done = _run_cli(config, "4242", "--force")  # measured, whatever other tests' jobs evaluated on trained_run
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), trained_run


def test_stdout_is_the_documented_json_and_matches_the_file(report) -> None:
    document, run = report
    assert EvaluatorReport.model_validate(document).version == document["version"] == 1
    saved = json.loads((run.results_dir / "evaluator_4242.json").read_text())
    assert saved == document
    assert (run.results_dir / "evaluator_4242.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert document["job_id"] == "4242" and document["finetuned_kind"] == "merged"


def test_values_are_finite_and_samples_come_from_the_test_split(report) -> None:
    document, run = report
    for side in ("base_model", "finetuned_model"):
        block = document[side]
        for key in SideReport.model_fields:
            if isinstance(block[key], float | int):
                assert math.isfinite(block[key]), f"{side}.{key}"
        assert block["prompts_scored"] == 3 and block["timing_runs"] == 3
        low, high = block["exact_match_ci95"]
        assert 0 <= low <= block["exact_match"] <= high <= 100
        low, high = block["rouge_l_ci95"]
        assert low <= block["rouge_l"] <= high
        assert block["perplexity_tokens"] > 0 and block["tokens_per_second"] > 0
        assert block["decode_tokens_per_second"] is None or block["decode_tokens_per_second"] > 0
        assert len(block["sample_generations"]) == 2
        assert {"input", "reference", "generated"} == set(block["sample_generations"][0])
    for key in Comparison.model_fields:
        value = document["comparison"][key]
        assert value is None and key in ("numeric_match", "decode_speed") or math.isfinite(value), key
    assert document["data"]["test"]["rows_kept"] == document["settings"]["test_rows_perplexity"]
    references = [json.loads(line)["messages"][-1]["content"] for line in run.test_jsonl.read_text().splitlines()]
    assert document["finetuned_model"]["sample_generations"][0]["reference"] == references[0]


def test_finetuned_perplexity_is_lower_than_base(report) -> None:
    document, _ = report
    base, tuned = document["base_model"]["perplexity"], document["finetuned_model"]["perplexity"]
    assert tuned < base
    assert document["comparison"]["perplexity"] == pytest.approx((base - tuned) / base * 100)


def test_missing_test_split_is_named(trained_run, tmp_path) -> None:
    data = json.loads(trained_run.model_dump_json())
    data["paths"]["data_dir"] = str(tmp_path / "nodata")
    config = tmp_path / "run.json"
    config.write_text(json.dumps(data))
    done = _run_cli(config, "1")
    assert done.returncode == 2
    assert str(tmp_path / "nodata") in done.stderr and done.stdout == ""


def test_an_unchanged_evaluation_reuses_the_report_and_a_changed_input_does_not(report, tmp_path) -> None:
    """Same inputs: the figures of the earlier job under the new job's id, nothing measured (no model is loaded,
    so no progress line); a model exported from another adapter (its manifest's hash), another eval section or another
    device is another digest; a model file touched (time only) is not (issue 64 item 4)."""
    document, run = report
    config = tmp_path / "run.json"
    config.write_text(run.model_dump_json())
    again = _run_cli(config, "4243")
    assert again.returncode == 0, again.stderr[-3000:]
    reused = json.loads(again.stdout)
    assert reused["measured_by_job"] == "4242" and reused["job_id"] == "4243"
    assert {k: v for k, v in reused.items() if k not in ("job_id", "measured_by_job")} == {
        k: v for k, v in document.items() if k not in ("job_id", "measured_by_job")}
    assert "perplexity" not in again.stderr and "reused" in again.stderr
    assert json.loads((run.results_dir / "evaluator_4243.json").read_text()) == reused

    digest = document["inputs_sha256"]
    assert inputs_sha256(run, "merged", "cpu", "float32") == digest
    assert current_report(run.results_dir, digest).measured_by_job in (None, "4242")
    other_eval = run.model_copy(update={"eval": run.eval.model_copy(update={"num_prompts": run.eval.num_prompts + 1})})
    assert inputs_sha256(other_eval, "merged", "cpu", "float32") != digest
    assert inputs_sha256(run, "merged", "cuda", "float32") != digest
    weights = next(run.merged_dir.glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    try:
        assert inputs_sha256(run, "merged", "cpu", "float32") == digest
    finally:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    manifest = run.merged_dir / "manifest.json"
    saved = manifest.read_bytes()
    exported = json.loads(saved)
    exported["adapter"]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(exported))
    try:
        assert inputs_sha256(run, "merged", "cpu", "float32") != digest
        assert current_report(run.results_dir, inputs_sha256(run, "merged", "cpu", "float32")) is None
    finally:
        manifest.write_bytes(saved)
