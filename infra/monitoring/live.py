"""One line of a running job's live figures from Prometheus, for `ftstack status`."""

from __future__ import annotations

from pathlib import Path

from infra.monitoring.jobs import URL_ENV, env_url_ignored, live_figures, prometheus_url
from infra.monitoring.prometheus import PrometheusError

_SHOWN = (("step", "step {:.0f}"), ("tokens_per_second", "{:.1f} tokens/s"), ("step_seconds", "{:.2f} s/step"),
          ("loss", "loss {:.4g}"), ("utilization_percent", "utilization {:.0f} %"),
          ("peak_memory_bytes", "peak memory {:.2f} GiB"))


def format_figures(figures: dict[str, float]) -> str:
    shown = {**figures, **({"peak_memory_bytes": figures["peak_memory_bytes"] / 2**30}
                           if "peak_memory_bytes" in figures else {})}
    return ", ".join(text.format(shown[name]) for name, text in _SHOWN if name in shown)


def live_line(target: str, repo_root: Path, job_id: str) -> str:
    """`live: ...` with the job's figures, or `live: unavailable (why)`; never raises for Prometheus' sake."""
    url = prometheus_url(target, repo_root)
    if url is None:
        return f"live: unavailable ({env_url_ignored() or f'no Prometheus known for this stack; set {URL_ENV}'})"
    try:
        figures = live_figures(url, job_id)
    except PrometheusError as error:
        return f"live: unavailable ({error})"
    if not figures:
        return f"live: no figures from job {job_id} in Prometheus at {url} yet"
    return "live: " + format_figures(figures)
