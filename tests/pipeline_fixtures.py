"""Fixtures of the pipeline tests (registered as a plugin in tests/conftest.py): a Slurm client on the local Slurm."""

from __future__ import annotations

import pytest

from infra.pipeline.slurm import SlurmClient
from infra.pipeline.transport import LocalTransport


@pytest.fixture
def slurm_client(slurm: str) -> SlurmClient:
    """A SlurmClient on this machine (LocalTransport) with the conftest's SLURM_CONF, polling twice a second."""
    return SlurmClient(LocalTransport(), env={"SLURM_CONF": slurm}, poll_s=0.5)
