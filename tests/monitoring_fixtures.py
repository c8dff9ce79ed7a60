"""A real Prometheus and node exporter (scripts/local-monitoring.sh) on free loopback ports under a tmp dir."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from serve_process import free_port

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


@dataclass(frozen=True)
class Monitoring:
    url: str
    textfile_dir: Path
    base: Path


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitoring]:
    """Started by the project's script with a 1 s scrape interval; stopped (by its pid files) after the module."""
    base = tmp_path_factory.mktemp("monitoring")
    prometheus_port, exporter_port = free_port(), free_port()
    env = {**os.environ, "LOCAL_MONITORING_DIR": str(base), "LOCAL_MONITORING_PROMETHEUS_PORT": str(prometheus_port),
           "LOCAL_MONITORING_NODE_EXPORTER_PORT": str(exporter_port), "LOCAL_MONITORING_SCRAPE_INTERVAL": "1s"}
    script = str(ROOT / "scripts" / "local-monitoring.sh")
    started = subprocess.run([script, "start"], env=env, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stderr
    try:
        yield Monitoring(url=(base / "prometheus.url").read_text().strip(), textfile_dir=base / "textfile", base=base)
    finally:
        subprocess.run([script, "stop"], env=env, capture_output=True, timeout=60)


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    """The first truthy answer of `probe` (Prometheus scrapes every second here), else a failure naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        if answer := probe():
            return answer
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)
