"""What a running server reports about itself, every few seconds: the served set with each name's measured
speed (`served_adapters.json` beside the run's results, read by the stack outputs and the dashboard) and the
same figures as Prometheus gauges labelled by adapter (the job's textfile, workloads.common.job_metrics)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from documents.adapter_registry import SERVED_SET_NAME, ServedSet, write_served_set
from documents.atomic import write_text_atomic
from workloads.common.job_metrics import JobFigures, JobMetricsFile
from workloads.serve.gateway.state import Gateway

log = logging.getLogger("workloads.serve")


def served_set(gateway: Gateway, base_name: str, base_sha: str, base_path: str, engine: str,
               url: str | None = None) -> ServedSet:
    """The set as it is now (admin loads and unloads included) with every name's figures so far."""
    adapters = [route.adapter for route in list(gateway.routes.values()) if route.adapter is not None]
    return ServedSet(base_name=base_name, base_model_sha256=base_sha, base_model_path=base_path, engine=engine,
                     adapters=adapters, speed=gateway.speeds(), url=url)


class ServedReporter:
    """A thread that rewrites the served set's file and the job's metrics file every `interval_s`, and once
    more at stop."""

    def __init__(self, gateway: Gateway, results_dir: Path, base: tuple[str, str, str], engine: str,
                 interval_s: float = 5.0, url: str | None = None) -> None:
        self.gateway, self.path, self.base, self.engine = gateway, results_dir / SERVED_SET_NAME, base, engine
        self.url = url
        self.metrics = JobMetricsFile.from_env("serve")
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="served-report", daemon=True)

    def report(self) -> None:
        """Write the set now (also called on every load and unload: a launcher that starts again reads it)."""
        served = served_set(self.gateway, *self.base, self.engine, self.url)
        try:
            with self._lock:
                write_text_atomic(self.path, write_served_set(served))
        except OSError as error:
            log.warning("cannot write %s: %s", self.path, error.strerror or error)
        self.metrics.update(JobFigures(), {name: speed.model_dump() for name, speed in served.speed.items()})

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.report()

    def __enter__(self) -> ServedReporter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.report()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.report()
        self.metrics.remove()
