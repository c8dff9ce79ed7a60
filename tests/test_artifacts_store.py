"""Run artifacts: same layout in the local directory store and in a real S3-compatible server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from artifacts_fixtures import S3Server, s3_server, start_server  # noqa: F401
from document_fixtures import evaluator_report, side
from moto.server import ThreadedMotoServer

from documents.metrics import MetricsRecord
from documents.run_record import read_run_record, write_run_record
from documents.stack_outputs import Cost, StackOutputs, read_stack_outputs
from infra.runs.store import (
    ArtifactError,
    ArtifactUploadError,
    LocalStore,
    S3Store,
    list_runs,
    read_run_file,
    upload_run,
)

LOCAL_CONFIG = Path(__file__).resolve().parents[1] / "workloads" / "configs" / "local.json"


def make_run(tmp_path: Path, base_ppl: float = 7.03, tuned_ppl: float = 4.70, eval_job: str = "41") -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "run.json"
    config.write_text(json.dumps({**json.loads(LOCAL_CONFIG.read_text()), "name": "demo", "paths": {"root": str(tmp_path)}}))
    train = tmp_path / "out" / "demo"
    train.mkdir(parents=True)
    (train / "metrics.jsonl").write_text("".join(
        MetricsRecord(step=s, epoch=s / 4, loss=3.0 - 0.4 * s, tokens_per_second=100.0 + s).line() for s in range(1, 5)))
    (train / "run_manifest.json").write_text(json.dumps({"run": "demo", "status": "completed"}))
    (train / "loss.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    results = tmp_path / "results"
    results.mkdir()
    report = evaluator_report(eval_job, side(base_ppl, 30.0), side(tuned_ppl, 28.0))
    (results / f"evaluator_{eval_job}.json").write_text(report.model_dump_json())
    (results / f"evaluator_{eval_job}.png").write_bytes(b"\x89PNG\r\n\x1a\nchart")
    (results / "evaluator_7.json").write_text(evaluator_report("7", side(99.0, 30.0)).model_dump_json())
    return {"run_config_path": config, "train_run_dir": train, "results_dir": results,
            "job_ids": {"prepare": "39", "train": "40", "eval": eval_job}}


def test_local_store_layout_index_and_listing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "artifacts")
    run = make_run(tmp_path / "r1")
    result = upload_run(store, "local", "20260101-000001", cost_usd=1.25, **run)
    root = tmp_path / "artifacts" / "runs" / "local" / "20260101-000001"
    expected = {"config/run.json", "train/metrics.jsonl", "train/run_manifest.json", "train/loss.png",
                "eval/evaluator_41.json", "eval/evaluator_41.png", "run.json"}
    assert {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} == expected
    assert "eval/evaluator_7.json" not in result.uploaded
    index = json.loads((root / "run.json").read_text())
    assert index["perplexity_base"] == pytest.approx(7.03)
    assert index["perplexity_finetuned"] == pytest.approx(4.70)
    assert index["perplexity_improvement_pct"] == pytest.approx((7.03 - 4.70) / 7.03 * 100)
    assert "tokens_per_second" not in index and index["throughput"] is None  # no measurement given: none made up
    assert index["train_loss_final"] == pytest.approx(3.0 - 1.6)
    assert index["run_name"] == "demo"  # from the run config, also when the folders are given (fetched runs)
    assert index["cost_usd"] == 1.25 and index["job_ids"]["eval"] == "41"
    assert (run["train_run_dir"] / "metrics.jsonl").is_file()

    upload_run(store, "local", "20260101-000002", **make_run(tmp_path / "r2", tuned_ppl=5.5, eval_job="50"))
    upload_run(store, "other", "x", **make_run(tmp_path / "r3", eval_job="60"))
    runs = list_runs(store, "local")
    assert [r.run_id for r in runs] == ["20260101-000001", "20260101-000002"]
    assert runs[1].perplexity_finetuned == pytest.approx(5.5)
    assert list_runs(store, "nothing-here") == []


def test_bad_metrics_line_is_named(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run["train_run_dir"] / "metrics.jsonl").write_text(MetricsRecord(step=1, epoch=1, loss=1).line() + "not json\n")
    with pytest.raises(ArtifactError, match=r"metrics.jsonl:2: not a metrics record"):
        upload_run(LocalStore(tmp_path / "a"), "local", "r", **run)


def test_s3_upload_lands_in_versioned_bucket(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = s3_server.new_bucket()
    store = S3Store(s3_server.client(), bucket, backoff_s=0.01)
    run = make_run(tmp_path)
    outputs = StackOutputs(stack="dev", target="nebius", cluster_name="slurm", slurm_target="soperator",
                           run_config="workloads/configs/dev.json",
                           cost=Cost(monthly_usd_low=1.0, monthly_usd_high=2.0, hours_per_month=730, pricing_date="2026-01-01"))
    result = upload_run(store, "dev", "run-1", outputs=outputs, **run)
    client = s3_server.client()
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {f"runs/dev/run-1/{name}" for name in result.uploaded} | {"runs/dev/run-1/run.json"}
    assert "outputs.json" in result.uploaded
    stored = read_run_file(store, "dev", "run-1", "outputs.json")
    assert read_stack_outputs(stored, "outputs.json") == outputs
    assert json.loads(stored)["cluster_name"] == "slurm" and json.loads(stored)["cost_monthly_usd_high"] == 2.0

    upload_run(store, "dev", "run-1", **run)
    versions = client.list_object_versions(Bucket=bucket, Prefix="runs/dev/run-1/run.json")["Versions"]
    assert len(versions) == 2
    [listed] = list_runs(store, "dev")
    assert listed.perplexity_base == pytest.approx(7.03) and listed.job_ids["train"] == "40"


def test_s3_client_error_is_not_retried_and_names_the_key(s3_server: S3Server, tmp_path: Path) -> None:
    store = S3Store(s3_server.client(), "no-such-bucket-here", backoff_s=0.01)
    with pytest.raises(ArtifactUploadError) as info:
        upload_run(store, "dev", "r", **make_run(tmp_path))
    assert store.retries == 0
    assert "s3://no-such-bucket-here/runs/dev/r" in str(info.value)
    assert "config/run.json" in info.value.failures


def test_upload_to_stopped_server_is_retried_reported_and_keeps_local_copy(tmp_path: Path) -> None:
    server = start_server()
    bucket = server.new_bucket()
    server.server.stop()
    store = S3Store(server.client(max_attempts=1, connect_timeout=1), bucket, attempts=3, backoff_s=0.01)
    run = make_run(tmp_path)
    with pytest.raises(ArtifactUploadError) as info:
        upload_run(store, "dev", "r", **run)
    error = info.value
    assert set(error.failures) >= {"config/run.json", "train/metrics.jsonl", "eval/evaluator_41.json"}
    assert error.uploaded == []
    assert "failed after 3 attempts" in str(error) and "local copies kept" in str(error)
    assert store.retries == 2 * len(error.failures)
    for path in (run["run_config_path"], run["train_run_dir"] / "metrics.jsonl", run["results_dir"] / "evaluator_41.json"):
        assert path.is_file()


def test_upload_succeeds_when_server_comes_back_during_retries(tmp_path: Path) -> None:
    server = start_server()
    bucket = server.new_bucket()
    port = int(server.endpoint.rsplit(":", 1)[1])
    server.server.stop()
    restarted: list[ThreadedMotoServer] = []

    def backoff(seconds: float) -> None:
        if not restarted:
            again = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            again.start()
            restarted.append(again)
        time.sleep(seconds)

    try:
        store = S3Store(server.client(max_attempts=1, connect_timeout=1), bucket, attempts=3, backoff_s=0.05,
                        sleep=backoff)
        result = upload_run(store, "dev", "r", **make_run(tmp_path))
        assert store.retries == 1 and restarted
        assert "config/run.json" in result.uploaded and result.index is not None
        assert list_runs(store, "dev")[0].run_id == "r"
    finally:
        for s in restarted:
            s.stop()


def test_upload_run_finds_files_through_the_run_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from documents.run_config import load_run_config

    repo = Path(__file__).resolve().parents[1]
    config_path = repo / "workloads" / "configs" / "local.json"
    monkeypatch.setenv("FT_ROOT", str(tmp_path / "work"))
    config = load_run_config(config_path)
    config.train_run_dir.mkdir(parents=True)
    (config.train_run_dir / "metrics.jsonl").write_text(MetricsRecord(step=1, epoch=1, loss=2.5).line())
    config.results_dir.mkdir(parents=True)
    (config.results_dir / "evaluator_local.json").write_text(evaluator_report("local", side(9.0, 3.0)).model_dump_json())
    (config.results_dir / "evaluator_local.png").write_bytes(b"png")
    store = LocalStore(tmp_path / "artifacts")
    result = upload_run(store, "local", "r1", config_path, job_ids={"eval": "local"})
    assert result.uploaded == ["config/local.json", "eval/evaluator_local.json", "eval/evaluator_local.png",
                               "train/metrics.jsonl"]
    assert result.index.run_name == config.name and result.index.train_loss_final == 2.5
    assert result.index.perplexity_base == 9.0 and result.index.perplexity_finetuned == 6.0


def test_upload_run_follows_the_train_sections_output_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_path = tmp_path / "run.json"
    config_path.write_text(json.dumps({"name": "moved", "paths": {"root": str(tmp_path / "work")},
                                       "model": {"source": "dir:/m"}, "data": {"source": "sample", "rows": 10},
                                       "train": {"output_dir": str(tmp_path / "elsewhere")}}))
    monkeypatch.delenv("FT_ROOT", raising=False)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "metrics.jsonl").write_text(MetricsRecord(step=3, epoch=1, loss=1.25).line())
    result = upload_run(LocalStore(tmp_path / "artifacts"), "dev", "r1", config_path, job_ids={"eval": "9"})
    assert result.uploaded == ["config/run.json", "train/metrics.jsonl"] and result.index.train_loss_final == 1.25


def test_a_run_record_written_before_the_one_throughput_figure_still_reads() -> None:
    """run.json files written before 2026-11-25 carried `tokens_per_second`, the last logged interval's figure."""
    old = ('{"stack": "local", "run_id": "20261101-080000", "uploaded_at": "2026-11-01T08:10:00+00:00", '
           '"tokens_per_second": 104.0, "train_loss_final": 1.4, "files": ["run.json"]}')
    index = read_run_record(old, "runs/local/20261101-080000/run.json")
    assert index.run_id == "20261101-080000" and index.train_loss_final == 1.4 and index.throughput is None
    assert "tokens_per_second" not in json.loads(write_run_record(index))
