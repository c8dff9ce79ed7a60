"""What the dashboard shows of the last run's job metrics: the series, or why they are unavailable."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from documents.run_record import RunIndex
from infra.monitoring.jobs import URL_ENV, JobSeries, env_url_ignored, job_series, jobs_selector, prometheus_url
from infra.monitoring.prometheus import PrometheusError

SHOWN_STAGES = ("train", "eval")
MARGIN = timedelta(minutes=1)


@dataclass(frozen=True)
class JobMetricsView:
    jobs: list[JobSeries] = field(default_factory=list)
    start: datetime | None = None
    query: str = ""
    source: str = ""
    unavailable: str | None = None
    """why no series are shown, one line."""


def _parse(stamp: str | None) -> datetime | None:
    if not stamp:
        return None
    moment = datetime.fromisoformat(stamp)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def job_metrics_view(target: str, repo_root: Path, run: RunIndex | None,
                     now: datetime | None = None) -> JobMetricsView:
    """The train and eval jobs' series of `run` over its time window (started to finished, else to now)."""
    url = prometheus_url(target, repo_root)
    if url is None:
        return JobMetricsView(unavailable=f"Metrics unavailable: {ignored}." if (ignored := env_url_ignored()) else
                              f"Metrics unavailable: no Prometheus known for this stack (set {URL_ENV}"
                              + (", or start it with scripts/local-monitoring.sh start)." if target == "local" else ")."))
    ids = [run.job_ids[s] for s in SHOWN_STAGES if run is not None and s in run.job_ids]
    if run is None or not ids:
        return JobMetricsView(source=url, unavailable="Metrics unavailable: no train or eval job in the last run.")
    end = (_parse(run.finished_at) or now or datetime.now(timezone.utc)) + MARGIN
    start = (_parse(run.started_at) or end - timedelta(days=1)) - MARGIN
    selector = jobs_selector(ids)
    try:
        jobs = job_series(url, ids, start, end)
    except PrometheusError as error:
        return JobMetricsView(query=selector, source=url, unavailable=f"Metrics unavailable: {error}")
    if not jobs:
        return JobMetricsView(query=selector, source=url,
                              unavailable=f"Metrics unavailable: Prometheus at {url} has no series for jobs "
                              f"{', '.join(ids)} from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC.")
    return JobMetricsView(jobs=jobs, start=start, query=selector, source=url)
