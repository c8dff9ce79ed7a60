"""Fixtures of the pipeline tests: the local Slurm (started by scripts/local-slurm.sh) and a client on it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from infra.pipeline.slurm import SlurmClient
from infra.pipeline.transport import LocalTransport

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """SLURM_CONF of the running local Slurm; fails in CI, skips elsewhere, when it cannot start."""
    conf = ROOT / ".local" / "slurm" / "etc" / "slurm.conf"
    proc = subprocess.run([str(ROOT / "scripts" / "local-slurm.sh"), "start"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        message = f"local Slurm did not start (scripts/local-slurm.sh start): {proc.stderr[-1500:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    os.environ["SLURM_CONF"] = str(conf)
    return str(conf)


@pytest.fixture
def slurm(slurm_conf: str) -> SlurmClient:
    return SlurmClient(LocalTransport(), env={"SLURM_CONF": slurm_conf}, poll_s=0.5)
