"""`ftstack report` end to end: the page renders in real headless Chromium, offline, with the key numbers."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from artifacts_fixtures import KEYS, REGION, S3Server, s3_server  # noqa: F401
from dashboard_fixtures import CHROMIUM, CHROMIUM_ARGS, EVALUATOR, REPO, stack_outputs, store_run
from playwright.sync_api import sync_playwright

from documents.stack_outputs import parse_stack_outputs
from infra.commands import report
from infra.runs.store import S3Store, local_store

SCREENSHOTS = REPO / ".local" / "screenshots"



@pytest.fixture(autouse=True)
def chromium() -> None:
    """Skip without Chromium on a developer's machine; in CI (CI=true) a missing browser is a failure."""
    if Path(CHROMIUM).exists():
        return
    message = f"Debian chromium not installed at {CHROMIUM} (make system-deps)"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{message}: CI runs the browser tests, it does not skip them")
    pytest.skip(message)


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ftstack")
    report.register(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "stacks", root / "stacks")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    monkeypatch.chdir(root)
    for name in ("FTSTACK_ARTIFACTS_BUCKET", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "FTSTACK_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return root


def open_page(page_file: Path, screenshot: Path) -> tuple[str, list[str], int]:
    """Visible text, every non-file request the page made, and the number of rendered charts."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_file.as_uri(), wait_until="load")
            text = page.inner_text("body")
            charts = page.locator("svg.chart").count()
            visible = page.evaluate("[...document.querySelectorAll('svg.chart')].every(s => s.getBoundingClientRect().width > 200)")
            assert visible, "a chart rendered narrower than 200 px"
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return text, [u for u in requests if not u.startswith("file:")], charts


def test_demo_stack_report_in_chromium(
    repo: Path, tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = stack_outputs("demo")
    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps(outputs))
    monkeypatch.setenv("FTSTACK_S3_ENDPOINT", s3_server.endpoint)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    out_dir = tmp_path / "dash"
    assert cli(["report", "--stack", "demo", "--outputs", str(outputs_file), "--out", str(out_dir)]) == 0
    captured = capsys.readouterr()
    assert "warning: runs not read" in captured.err and "AWS_ACCESS_KEY_ID" in captured.err
    text, requests, charts = open_page(Path(captured.out.strip()), SCREENSHOTS / "dashboard-demo-no-runs.png")
    assert requests == [] and "runs not read from the artifacts store" in text
    assert "Pipeline not run yet" in text and "Training not run yet" in text and charts == 3

    bucket = outputs["artifacts_bucket_name"]
    s3 = s3_server.client()
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    run = store_run(S3Store(s3, bucket), "demo", tmp_path / "work")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEYS["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEYS["secret_access_key"])
    assert cli(["report", "--stack", "demo", "--outputs", str(outputs_file), "--out", str(out_dir)]) == 0
    page_file = Path(capsys.readouterr().out.strip())
    assert page_file == (out_dir / "index.html").resolve()
    text, requests, charts = open_page(page_file, SCREENSHOTS / "dashboard-demo.png")
    assert requests == []
    low, high = outputs["cost_monthly_usd_low"], outputs["cost_monthly_usd_high"]
    assert f"${low:,.0f} – ${high:,.0f}" in text
    assert f"${high:,.2f}" in text
    for key, value in outputs.items():
        if key.startswith("cost_per_chat_") and key.endswith("_usd") and value is not None:  # measured: null until eval
            assert (f"${value:,.4f}" if value < 0.01 else f"${value:,.2f}") in text
    assert outputs["cluster_name"] in text and bucket in text
    assert outputs["node_group_worker_preset"] in text and "/mnt/data" in text
    assert "7.033 → 4.704" in text and text.count("COMPLETED") >= 4 and "1h 02m 05s" in text
    assert f"final train loss {run['final_loss']:.4g}" in text
    assert "not run yet" not in text
    assert charts == 5


def test_local_stack_report_with_stored_run(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "dash"
    assert cli(["report", "--stack", "local", "--out", str(out_dir)]) == 0
    text, _, charts = open_page(Path(capsys.readouterr().out.strip()), SCREENSHOTS / "dashboard-local-empty.png")
    mock = stack_outputs("local")
    stages = [k.removeprefix("pipeline_").removesuffix("_job_id") for k in mock if k.endswith("_job_id")]
    assert stages and all(mock[f"pipeline_{stage}_job_id"] in text for stage in stages)
    assert text.count(mock[f"pipeline_{stages[0]}_state"]) >= len(stages)
    assert "Evaluation not run yet" in text and "Training not run yet" in text and charts == 0
    assert "the mock run of stacks/Pulumi.local.yaml" in text and "workloads/configs/local.json" in text
    outputs_file = tmp_path / "plan.json"
    without_pipeline = parse_stack_outputs(mock, "mock").model_copy(update={"pipeline": None}).flat()
    outputs_file.write_text(json.dumps({"resources": [], "outputs": without_pipeline}))  # `ftstack plan --json`

    run = store_run(local_store(repo), "local", tmp_path / "work")
    assert cli(["report", "--stack", "local", "--outputs", str(outputs_file), "--out", str(out_dir)]) == 0
    text, requests, charts = open_page(out_dir / "index.html", SCREENSHOTS / "dashboard-local.png")
    assert requests == []
    assert "7.033 → 4.704" in text
    assert f"{(4.704128742218018 - 7.033111572265625) / 7.033111572265625 * 100:+.1f} %" in text
    assert text.count("COMPLETED") >= 4 and "1h 02m 05s" in text and "103" in text
    assert f"final train loss {run['final_loss']:.4g}" in text
    assert str(EVALUATOR.finetuned_model.tokens_per_second) in text
    assert "What does a <b>bond</b> coupon mean?" in text, "the sample's markup shows as text, escaped"
    assert "single-node Slurm" in text
    assert charts == 2
    assert not list(out_dir.glob(".index.html.*"))


def test_bad_outputs_file_is_named(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "outputs.json"
    bad.write_text("{not json")
    assert cli(["report", "--stack", "local", "--outputs", str(bad), "--out", str(tmp_path / "d")]) == 2
    assert f"{bad}: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "d" / "index.html").exists()
