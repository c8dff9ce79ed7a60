"""Where a stack's environment lives on the cluster and what builds it: a pure function of the stack and the lock."""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict

from infra.config import StackConfig
from infra.environment.lock import TARGETS, WHEEL_PLATFORM, lock_hash
from infra.environment.source import environment_key

SOURCES_DIR = "sources"


class EnvironmentPlan(BaseModel):
    """The environment of a stack: its key, folder and interpreter on the cluster, and how it is built."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    lock_hash: str
    lock: str
    source: str
    image: str | None
    python_version: str
    platform: str
    root: str
    """The environments' folder as login and nodes see it."""
    base_python: str
    """The cluster's own interpreter, which builds the environment."""

    @property
    def folder(self) -> str:
        return f"{self.root}/{self.key}"

    @property
    def python(self) -> str:
        """The interpreter every job after the environment stage runs."""
        return f"{self.folder}/bin/python"

    @property
    def source_dir(self) -> str:
        """Where the shipped lock (and wheelhouse) lands."""
        return f"{self.root}/{SOURCES_DIR}/{self.key}"

    @property
    def fingerprint(self) -> str:
        payload = json.dumps({"key": self.key, "source": self.source, "image": self.image}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def environment_plan(stack: StackConfig) -> EnvironmentPlan | None:
    """The stack's environment (None on the local stack: the repository's venv, from the same lock)."""
    config = stack.environment
    if config is None:
        return None
    target = TARGETS[config.lock]
    root = PurePosixPath(config.root)
    if stack.cluster is not None:
        root = PurePosixPath(stack.cluster.jail_root) / root.relative_to("/")
    return EnvironmentPlan(
        key=environment_key(target), lock_hash=lock_hash(target.file), lock=config.lock, source=config.source,
        image=config.image, python_version=target.python, platform=WHEEL_PLATFORM[target.platform], root=str(root),
        base_python=stack.pipeline.python,
    )
