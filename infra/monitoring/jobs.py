"""A Slurm job's series in Prometheus, selected by the `hpc_job` label, and where a stack's Prometheus is."""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict

from infra.monitoring.prometheus import Series, label_matcher, query, query_range
from workloads.common.job_metrics import JOB_LABEL, PREFIX

URL_ENV = "FTSTACK_PROMETHEUS_URL"
LOCAL_URL_FILE = ".local/monitoring/prometheus.url"
"""written by scripts/local-monitoring.sh start."""
MAX_POINTS = 400
"""points per series a range query asks for at most."""


def url_problem(url: str) -> str | None:
    """Why `url` cannot be Prometheus' base URL (http or https, with a host), or None."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as error:
        return f"not a URL ({error})"
    if parsed.scheme not in ("http", "https"):
        return f"it does not start with http:// or https:// (scheme {parsed.scheme or 'missing'!r})"
    if not parsed.host:
        return "it names no host"
    return None


def env_url_ignored() -> str | None:
    """`$FTSTACK_PROMETHEUS_URL ... is ignored: why` when the variable is set but unusable, else None."""
    url = os.environ.get(URL_ENV)
    if url is None:
        return None
    problem = url_problem(url) if url.strip() else "it is empty"
    return f"{URL_ENV}={url!r} is ignored: {problem}" if problem else None


_said: set[str] = set()


def prometheus_url(target: str, repo_root: Path) -> str | None:
    """$FTSTACK_PROMETHEUS_URL, else for the local stack the URL scripts/local-monitoring.sh recorded; None when
    neither is known. A malformed $FTSTACK_PROMETHEUS_URL is ignored, and said so once on stderr."""
    if (ignored := env_url_ignored()) is not None:
        if ignored not in _said:
            _said.add(ignored)
            print(f"ftstack: {ignored}", file=sys.stderr)
    elif url := os.environ.get(URL_ENV):
        return url
    if target == "local":
        try:
            return (repo_root / LOCAL_URL_FILE).read_text(encoding="utf-8").strip() or None
        except OSError:
            return None
    return None


def jobs_selector(job_ids: Sequence[str]) -> str:
    """PromQL selecting every ftstack_job_* series of these Slurm jobs, e.g.
    `{__name__=~"ftstack_job_.+",hpc_job=~"12|13"}`."""
    if not job_ids:
        raise ValueError("jobs_selector: no job ids")
    ids = "|".join(re.escape(j) for j in job_ids)
    return f'{{__name__=~"{PREFIX}.+",{JOB_LABEL}=~{label_matcher(ids)}}}'


def figure(series: Series) -> str:
    """The JobFigures field a series carries (its metric name after `ftstack_job_`)."""
    return series.metric.removeprefix(PREFIX)


class JobSeries(BaseModel):
    """One job's series over a window: figure name -> points, with the job's stage."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    stage: str
    figures: dict[str, Series]


def job_series(base_url: str, job_ids: Sequence[str], start: datetime, end: datetime) -> list[JobSeries]:
    """Every ftstack_job_* series of `job_ids` from `start` to `end`, grouped by job (in `job_ids` order)."""
    step = max(1.0, math.ceil((end - start).total_seconds() / MAX_POINTS))
    found: dict[str, JobSeries] = {}
    for series in query_range(base_url, jobs_selector(job_ids), start, end, step):
        job = series.labels.get(JOB_LABEL, "")
        entry = found.setdefault(job, JobSeries(job_id=job, stage=series.labels.get("stage", "?"), figures={}))
        entry.figures[figure(series)] = series
    return [found[j] for j in job_ids if j in found]


def live_figures(base_url: str, job_id: str) -> dict[str, float]:
    """The latest value of each figure of a running job (empty when it exports none yet)."""
    return {figure(s): s.points[-1].value for s in query(base_url, jobs_selector([job_id])) if s.points}
