"""Where a stack's environment lives on the cluster and what builds it: a pure function of the stack and the lock."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

from pydantic import BaseModel, ConfigDict

from documents.environment_manifest import EnvironmentManifest
from documents.stack_outputs import Environment
from infra.config import StackConfig
from infra.environment.lock import TARGETS, WHEEL_PLATFORM, Target, lock_hash, verify_lock
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
    """The stack's environment (None on the local stack: the repository's venv, from the same lock); LockError when
    the lock is not the one `make lock` wrote for this pyproject."""
    config = stack.environment
    if config is None:
        return None
    target = TARGETS[config.lock]
    verify_lock(target)
    root = PurePosixPath(config.root)
    if stack.cluster is not None:
        root = PurePosixPath(stack.cluster.jail_root) / root.relative_to("/")
    return EnvironmentPlan(
        key=environment_key(target), lock_hash=lock_hash(target.file), lock=config.lock, source=config.source,
        image=config.image, python_version=target.python, platform=WHEEL_PLATFORM[target.platform], root=str(root),
        base_python=stack.pipeline.python,
    )


def check_stack_lock(stack: StackConfig) -> None:
    """LockError naming the stale or damaged file where the stack builds an environment from a lock that is not the
    one `make lock` wrote for this pyproject (`ftstack plan` checks it before planning anything)."""
    if stack.environment is not None:
        verify_lock(TARGETS[stack.environment.lock])


def wheels_bytes(target: Target) -> int:
    """Download size of the files uv chose for the target (the PEP 751 lock's sizes; a local file's own size)."""
    total = 0
    for package in tomllib.loads(target.pylock.read_text())["packages"]:
        chosen = (package.get("wheels") or [package.get("sdist")])[0]
        size = chosen.get("size")
        if size is None and chosen["url"].startswith("file://"):
            local = Path(unquote(urlparse(chosen["url"]).path))
            size = local.stat().st_size if local.is_file() else 0
        total += size or 0
    return total


def environment_section(plan: EnvironmentPlan, built: EnvironmentManifest | None = None) -> Environment:
    """The stack outputs' environment: the plan's lock and source, with the build's size and time once built."""
    return Environment(key=plan.key, lock_hash=plan.lock_hash, source=plan.source, image=plan.image,
                       wheels_bytes=wheels_bytes(TARGETS[plan.lock]),
                       size_bytes=built.size_bytes if built else None,
                       build_seconds=built.build_seconds if built else None)
