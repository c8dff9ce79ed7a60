"""The documents that cross a process boundary: each is one pydantic model beside its writer.

What a reader relies on: a written document validates against its model, the version is written, a missing
or misspelled field is an error naming it, and a file from before the version field still reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from document_fixtures import evaluator_report, side
from pydantic import ValidationError

from documents.base import DocumentError
from documents.evaluator_report import EvaluatorReport, read_evaluator_report, write_report
from documents.metrics import MetricsRecord, load_metrics, read_metrics as read_metrics_text, truncate_metrics
from documents.readiness_report import CheckResult, ReadinessReport, read_readiness_report
from documents.run_manifest import RunManifest, finish_attempt, load_run_manifest, read_run_manifest as read_run_manifest_text, start_attempt
from workloads.checks.readiness import check_line


def test_evaluator_report_round_trips_through_its_file(tmp_path: Path) -> None:
    report = evaluator_report("77", finetuned=side(6.0, 28.0, sample_generations=[
        {"input": "q", "reference": "r", "generated": "g"}]))
    path = write_report(report, tmp_path)
    assert path.name == "evaluator_77.json"
    document = json.loads(path.read_text())
    assert document["version"] == 1 and document["comparison"]["perplexity"] == pytest.approx(50.0)
    assert EvaluatorReport.model_validate_json(path.read_text()) == report


def test_evaluator_report_names_a_missing_or_unknown_field() -> None:
    document = evaluator_report().model_dump()
    del document["finetuned_model"]["tokens_per_second"]
    with pytest.raises(ValidationError, match=r"finetuned_model\.tokens_per_second"):
        EvaluatorReport.model_validate(document)
    document = evaluator_report().model_dump()
    document["base_model"]["tokens_per_sec"] = 3.0
    with pytest.raises(ValidationError, match=r"base_model\.tokens_per_sec"):
        EvaluatorReport.model_validate(document)


def test_evaluator_report_without_version_is_version_1_and_a_newer_one_is_refused() -> None:
    document = evaluator_report().model_dump()
    del document["version"]
    assert EvaluatorReport.model_validate(document).version == 1
    with pytest.raises(ValidationError, match="version"):
        EvaluatorReport.model_validate({**document, "version": 2})


def test_metrics_records_omit_unset_figures_and_skip_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [MetricsRecord(step=s, epoch=s / 4, loss=3.0 - s, tokens_per_second=100.0 + s).line() for s in (1, 2, 3)]
    eval_line = MetricsRecord(step=2, epoch=0.5, eval_loss=2.5).line()
    path.write_text(lines[0] + lines[1] + eval_line + lines[2] + '{"step": 4, "epo')
    assert json.loads(eval_line) == {"version": 1, "step": 2, "epoch": 0.5, "eval_loss": 2.5}
    records = load_metrics(path)
    assert [(r.step, r.loss, r.eval_loss) for r in records] == [(1, 2.0, None), (2, 1.0, None), (2, None, 2.5),
                                                                 (3, 0.0, None)]
    truncate_metrics(path, 2)
    assert [r.step for r in load_metrics(path)] == [1, 2, 2]


def _base() -> dict:
    return {
        "run": "demo", "config_sha256": "a" * 64, "config": {"name": "demo"}, "precision": "fp32",
        "dataset": {"path": "/d", "sha256": "b" * 64, "prepare_manifest_sha256": None},
        "base_model": {"path": "/m", "sha256": "c" * 64, "from": "computed", "source": None},
        "packages": {"torch": "2.13.0"}, "git_commit": None, "world_size": 2, "nodes": 1,
    }


def test_run_manifest_attempts_and_completion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run_manifest.json"
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    first = start_attempt(path, _base(), 0)
    finish_attempt(path, first, "interrupted", 3)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    second = start_attempt(path, _base(), 3)
    done = finish_attempt(path, second, "completed", 5, adapter="/out/adapter")
    document = json.loads(path.read_text())
    assert document["version"] == 1 and document["base_model"]["from"] == "computed"
    assert document["started"] == first.started and document["ended"] and document["adapter"] == "/out/adapter"
    assert [(a["status"], a["global_step"], a["slurm_restart_count"]) for a in document["attempts"]] == [
        ("interrupted", 3, 0), ("completed", 5, 1)]
    assert load_run_manifest(path) == done == RunManifest.model_validate(document)


def test_run_manifest_of_another_config_starts_over_and_a_bad_one_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "run_manifest.json"
    start_attempt(path, _base(), 0)
    assert len(start_attempt(path, {**_base(), "config_sha256": "d" * 64}, 0).attempts) == 1
    path.write_text('{"run": "demo"}')
    assert load_run_manifest(path) is None


def test_readiness_report_line_and_model() -> None:
    check = CheckResult(name="gpu_memory", status="fail", node="n1", gpu=0, value=40.0, threshold=43.2, unit="GiB")
    assert check_line(check) == "gpu_memory [n1/0]: fail 40.0 GiB (threshold 43.2)"
    with pytest.raises(ValidationError, match="interconnect"):
        ReadinessReport.model_validate({"ok": True, "created_at": "x", "world_size": 1, "interconnect": "carrier pigeon",
                                        "config": {}, "floors": {"busbw_gbs": 1.0}, "nodes": [], "measurements": [],
                                        "checks": [], "failures": []})


def test_infra_readers_name_the_origin_and_the_field() -> None:
    report = evaluator_report("5")
    assert read_evaluator_report(report.model_dump_json(), "r.json") == report
    with pytest.raises(DocumentError, match=r"^ssh:/r/evaluator_5.json: not a valid evaluator report \(comparison: Field"):
        read_evaluator_report(json.dumps({k: v for k, v in report.model_dump().items() if k != "comparison"}),
                              "ssh:/r/evaluator_5.json")
    with pytest.raises(DocumentError, match=r"manifest.json: not a valid run manifest \(run: Field required"):
        read_run_manifest_text('{"name": "demo", "steps": 4}', "manifest.json")
    with pytest.raises(DocumentError, match=r"r.json: not a valid readiness report"):
        read_readiness_report("[]", "r.json")


def test_metrics_reader_is_strict_about_lines_unless_reading_a_live_tail() -> None:
    text = 'h": 1}\n' + MetricsRecord(step=1, epoch=0.1, loss=2.0).line() + '{"step": 2, "lo'
    with pytest.raises(DocumentError, match=r"^m.jsonl:1: not a metrics record"):
        read_metrics_text(text, "m.jsonl")
    assert [r.loss for r in read_metrics_text(text, "m.jsonl", live=True)] == [2.0]


def test_a_metrics_file_from_before_the_one_name_per_quantity_still_reads() -> None:
    """Lines written before 2026-11-25 named the figures tokens_per_s and tokens_per_second_per_gpu."""
    old = '{"step": 3, "epoch": 0.5, "loss": 1.5, "tokens": 900, "tokens_per_s": 300.0, "tokens_per_second_per_gpu": 150.0}\n'
    (record,) = read_metrics_text(old, "old/metrics.jsonl")
    assert record.tokens_per_second == 300.0 and record.tokens_per_second_per_device == 150.0
    assert '"tokens_per_second":300.0' in record.line() and "tokens_per_s\"" not in record.line()
