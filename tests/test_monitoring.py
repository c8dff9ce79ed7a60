"""Job metrics through a real node exporter and Prometheus: a training record found by Slurm job id, exposition
text parsed by Prometheus itself, the dashboard's chart (or its 'unavailable' line), jobs unaffected without a
textfile folder."""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from documents.run_record import RunIndex
from infra.config import load_stack_config
from infra.dashboard import build, render_html
from infra.monitoring.jobs import URL_ENV, job_series, jobs_selector, live_figures
from infra.monitoring.live import live_line
from infra.monitoring.prometheus import Point, PrometheusError, query, query_range
from infra.monitoring.view import job_metrics_view
from monitoring_fixtures import Monitoring, eventually
from workloads.common.job_metrics import TEXTFILE_DIR_ENV, JobFigures, JobMetricsFile, ProcessSampler
from serve_process import free_port
from documents.metrics import MetricsRecord
from workloads.train.metrics_export import record_figures

REPO = Path(__file__).resolve().parents[1]
RECORD = MetricsRecord(step=7, epoch=0.5, loss=1.875, tokens_per_second=1234.5, tokens=4096, memory_mb=512.0,
                       cpu_util=87.5, step_time_s=0.42, job_id="4242")


def _publish(monitoring: Monitoring, job: str, stage: str = "train", run: str = "tiny") -> JobMetricsFile:
    file = JobMetricsFile(monitoring.textfile_dir, job, stage, run)
    file.update(record_figures(RECORD))
    return file


def test_prometheus_answers_a_training_jobs_tokens_per_second_by_slurm_job_id(
        monitoring: Monitoring, monkeypatch: pytest.MonkeyPatch) -> None:
    _publish(monitoring, "4242")
    found = eventually(lambda: query(monitoring.url, 'ftstack_job_tokens_per_second{hpc_job="4242"}'),
                       "Prometheus to scrape the job's tokens/s")
    (series,) = found
    assert series.points[0].value == 1234.5
    assert series.labels["stage"] == "train" and series.labels["run"] == "tiny" and series.labels["job"] == "node"
    figures = live_figures(monitoring.url, "4242")
    assert figures["loss"] == 1.875 and figures["step"] == 7 and figures["step_seconds"] == 0.42
    assert figures["utilization_percent"] == 87.5 and figures["peak_memory_bytes"] == 512 * 2**20
    monkeypatch.setenv(URL_ENV, monitoring.url)
    assert live_line("local", REPO, "4242") == ("live: step 7, 1234.5 tokens/s, 0.42 s/step, loss 1.875, "
                                                "utilization 88 %, peak memory 0.50 GiB")
    now = datetime.now(timezone.utc)
    (ranged,) = query_range(monitoring.url, 'ftstack_job_loss{hpc_job="4242"}', now - timedelta(minutes=2), now, 1)
    assert ranged.points and all(isinstance(p, Point) and p.value == 1.875 for p in ranged.points)


def test_the_exposition_text_is_parsed_back_by_prometheus(monitoring: Monitoring) -> None:
    """Label values with quotes, backslashes and a newline, and a gpu record: Prometheus reads them as written,
    and the node exporter reports no textfile error."""
    run = 'odd "run"\\name\nline 2'
    file = JobMetricsFile(monitoring.textfile_dir, "4343", "train", run)
    file.update(record_figures(RECORD.model_copy(update={"gpu_util": 55.0, "cpu_util": None})))
    series = eventually(lambda: query(monitoring.url, 'ftstack_job_utilization_percent{hpc_job="4343"}'),
                        "Prometheus to scrape the odd labels")
    assert series[0].labels["run"] == run and series[0].labels["device"] == "gpu"
    assert series[0].points[0].value == 55.0
    errors = query(monitoring.url, "node_textfile_scrape_error")
    assert [s.points[0].value for s in errors] == [0.0]


def test_a_finished_jobs_file_is_removed_and_its_series_ends(monitoring: Monitoring) -> None:
    file = _publish(monitoring, "4444", stage="eval")
    eventually(lambda: live_figures(monitoring.url, "4444"), "the eval job's series")
    file.remove()
    assert not list(monitoring.textfile_dir.glob("*4444*"))
    eventually(lambda: not live_figures(monitoring.url, "4444"), "the series to go stale")


def test_the_dashboard_charts_the_last_runs_jobs_from_prometheus(monitoring: Monitoring,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _publish(monitoring, "4545")
    JobMetricsFile(monitoring.textfile_dir, "4546", "eval", "tiny").update(
        JobFigures(tokens_per_second=42.0, utilization_percent=50.0))
    eventually(lambda: len(query(monitoring.url, jobs_selector(["4545", "4546"]))) >= 2, "both jobs' series")
    monkeypatch.setenv(URL_ENV, monitoring.url)
    started = datetime.now(timezone.utc) - timedelta(minutes=5)
    index = RunIndex(stack="local", run_id="r1", uploaded_at=started.isoformat(), started_at=started.isoformat(),
                     job_ids={"prepare": "4544", "train": "4545", "eval": "4546"})
    view = job_metrics_view("local", REPO, index)
    assert view.unavailable is None
    assert [(j.stage, j.job_id) for j in view.jobs] == [("train", "4545"), ("eval", "4546")]
    assert view.jobs[0].figures["tokens_per_second"].points[-1].value == 1234.5
    data = build("local", None, load_stack_config("local", REPO / "stacks"))
    data.job_metrics = view
    page = render_html(data, "test")
    section = page[page.index('<section id="job-metrics">'):]
    section = section[:section.index("</section>")]
    assert "<svg" in section and "Throughput (tokens/s)" in section and "train 4545" in section
    assert "Metrics unavailable" not in page
    page_file = monitoring.base / "dashboard" / "index.html"
    page_file.parent.mkdir(exist_ok=True)
    page_file.write_text(page, encoding="utf-8")
    text, width = _job_metrics_in_chromium(page_file, REPO / ".local" / "screenshots" / "dashboard-job-metrics.png")
    assert "Job metrics (Prometheus)" in text and "train 4545" in text and width > 400


def _job_metrics_in_chromium(page_file: Path, screenshot: Path) -> tuple[str, float]:
    """The job-metrics section's visible text and its chart's rendered width in headless Chromium, with a
    screenshot of that section."""
    from dashboard_fixtures import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        message = f"Debian chromium not installed at {CHROMIUM} (make system-deps)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"{message}: CI runs the browser tests, it does not skip them")
        pytest.skip(message)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(page_file.as_uri(), wait_until="load")
            section = page.locator("#job-metrics")
            text = section.inner_text()
            width = page.evaluate("document.querySelector('#job-metrics svg').getBoundingClientRect().width")
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            section.screenshot(path=str(screenshot))
        finally:
            browser.close()
    return text, width


def test_with_prometheus_down_the_dashboard_and_status_say_metrics_are_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv(URL_ENV, down)
    index = RunIndex(stack="local", run_id="r1", uploaded_at="2026-11-25T06:00:00+00:00",
                     started_at="2026-11-25T06:00:00+00:00", job_ids={"train": "12"})
    view = job_metrics_view("local", REPO, index)
    assert view.jobs == [] and view.unavailable.startswith("Metrics unavailable: ") and down in view.unavailable
    data = build("local", None, load_stack_config("local", REPO / "stacks"))
    data.job_metrics = view
    page = render_html(data, "test")
    assert '<p class="warning">Metrics unavailable: ' in page
    assert live_line("local", REPO, "12").startswith(f"live: unavailable ({down}")
    with pytest.raises(PrometheusError, match=down):
        job_series(down, ["12"], datetime.now(timezone.utc) - timedelta(minutes=1), datetime.now(timezone.utc))


def test_no_prometheus_known_for_a_cloud_stack_is_said_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    view = job_metrics_view("nebius", REPO, None)
    assert view.unavailable == f"Metrics unavailable: no Prometheus known for this stack (set {URL_ENV})."
    assert live_line("nebius", REPO, "12") == f"live: unavailable (no Prometheus known for this stack; set {URL_ENV})"


def test_jobs_run_unchanged_without_a_textfile_folder_or_with_one_they_cannot_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(TEXTFILE_DIR_ENV, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    unset = JobMetricsFile.from_env("eval", "tiny")
    with ProcessSampler(unset, interval_s=0.01):
        unset.update(JobFigures(tokens_per_second=1.0))
    assert unset.path is None and list(tmp_path.iterdir()) == []

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(TEXTFILE_DIR_ENV, str(blocker / "textfile"))
    broken = JobMetricsFile.from_env("train", "tiny")
    with caplog.at_level(logging.WARNING, logger="workloads.job_metrics"):
        broken.update(record_figures(RECORD))
        broken.update(record_figures(RECORD))
        broken.remove()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "job metrics off: cannot write" in warnings[0] and "not-a-folder" in warnings[0]
    assert broken.figures.loss == 1.875
