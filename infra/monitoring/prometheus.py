"""Prometheus' HTTP API (`/api/v1/query`, `/api/v1/query_range`) read into typed series."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

DEFAULT_TIMEOUT_S = 5.0


class PrometheusError(Exception):
    """Prometheus cannot be reached, or refused or could not answer the query (the message says which)."""


class Point(BaseModel):
    model_config = ConfigDict(frozen=True)

    time: datetime
    value: float


class Series(BaseModel):
    """One time series: its labels (`__name__` is the metric) and its points, oldest first."""

    model_config = ConfigDict(frozen=True)

    labels: dict[str, str]
    points: list[Point]

    @property
    def metric(self) -> str:
        return self.labels.get("__name__", "")


class _Result(BaseModel):
    metric: dict[str, str]
    value: tuple[float, str] | None = None
    values: list[tuple[float, str]] = []


class _Data(BaseModel):
    resultType: Literal["matrix", "vector"]
    result: list[_Result]


class _Answer(BaseModel):
    status: Literal["success", "error"]
    data: _Data | None = None
    errorType: str | None = None
    error: str | None = None


def _point(pair: tuple[float, str]) -> Point:
    return Point(time=datetime.fromtimestamp(pair[0], timezone.utc), value=float(pair[1]))


def _get(base_url: str, path: str, params: dict[str, str], timeout_s: float) -> _Data:
    url = base_url.rstrip("/") + path
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as error:
        raise PrometheusError(f"{base_url}: not a valid Prometheus URL ({error})") from None
    try:
        response = httpx.get(url, params=params, timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL) as error:
        raise PrometheusError(f"{url}: {error or type(error).__name__}") from None
    try:
        answer = _Answer.model_validate_json(response.content)
    except ValidationError:
        raise PrometheusError(f"{url}: HTTP {response.status_code}, not a Prometheus API answer: "
                              f"{response.text[:200]!r}") from None
    if answer.status != "success" or answer.data is None:
        raise PrometheusError(f"{url}: query {params['query']!r} failed: {answer.errorType}: {answer.error}")
    return answer.data


def query(base_url: str, promql: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Series]:
    """An instant query: one point (the latest) per series."""
    data = _get(base_url, "/api/v1/query", {"query": promql}, timeout_s)
    return [Series(labels=r.metric, points=[_point(r.value)] if r.value else []) for r in data.result]


def query_range(base_url: str, promql: str, start: datetime, end: datetime, step_s: float,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Series]:
    """A range query from `start` to `end`, one point every `step_s` seconds where the series has a value."""
    if end <= start or step_s <= 0:
        raise ValueError(f"query_range: need start < end and step_s > 0, got {start} .. {end}, step {step_s}")
    params = {"query": promql, "start": f"{start.timestamp():.3f}", "end": f"{end.timestamp():.3f}",
              "step": f"{step_s:g}"}
    data = _get(base_url, "/api/v1/query_range", params, timeout_s)
    return [Series(labels=r.metric, points=[_point(v) for v in r.values]) for r in data.result]


def label_matcher(value: str) -> str:
    """A PromQL string literal for a label value."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
