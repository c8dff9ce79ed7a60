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
from infra.config import EnvironmentConfig, StackConfig
from infra.environment.lock import TARGETS, WHEEL_PLATFORM, Target, lock_hash, pins, verify_lock
from infra.environment.serving_lock import SERVE_TARGETS, ServeTarget
from infra.environment.source import environment_key

SOURCES_DIR = "sources"
SERVING_LOCK = "serve-jail"
"""the serving lock's target the cluster's serving environment is built from (infra.environment.serving_lock)."""


def lock_target(name: str) -> Target | ServeTarget:
    """A lock target by name: the workloads' (local, jail) or the serving lock's (serve-local, serve-jail)."""
    return TARGETS[name] if name in TARGETS else SERVE_TARGETS[name]


class _BuiltEnvironment(BaseModel):
    """An environment the environment stage builds: its key, folder and interpreter on the cluster, and how."""

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


class ServingEnvironmentPlan(_BuiltEnvironment):
    """vLLM's environment (the serving lock's jail target), beside the workloads' one under the same root."""

    vllm_version: str
    """the vLLM version its lock pins: what readiness finds importing vLLM from it."""


class EnvironmentPlan(_BuiltEnvironment):
    """The environment of a stack, and on a stack with GPU workers the serving environment its serve job uses."""

    serving: ServingEnvironmentPlan | None = None
    """Built by the same job when the chain serves (`build_fingerprint`, infra.pipeline.chain.environment_job)."""

    def build_fingerprint(self, serve: bool) -> str:
        """The environment job's fingerprint: the workloads' environment, and the serving one where it is built."""
        if not (serve and self.serving is not None):
            return self.fingerprint
        payload = f"{self.fingerprint}+{self.serving.fingerprint}"
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def serving_plan(stack: StackConfig, config: EnvironmentConfig, root: str) -> ServingEnvironmentPlan | None:
    """The serving environment of a stack whose workers have GPUs (where `serve.engine: auto` picks vLLM); None on
    CPU workers, where serving stays on the peft engine of the workloads' environment."""
    if not stack.gpu_workers:
        return None
    target = SERVE_TARGETS[SERVING_LOCK]
    return ServingEnvironmentPlan(
        key=environment_key(target), lock_hash=lock_hash(target.file), lock=SERVING_LOCK, source=config.source,
        image=config.image, python_version=target.python, platform=WHEEL_PLATFORM[target.platform], root=root,
        base_python=stack.pipeline.python, vllm_version=pins(target.file.read_text())["vllm"],
    )


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
        base_python=stack.pipeline.python, serving=serving_plan(stack, config, str(root)),
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
    """The stack outputs' environment: the plan's lock and source, with the build's size and time once built, and
    the serving environment's lock, vLLM version and folder where the stack has one."""
    serving = plan.serving
    return Environment(key=plan.key, lock_hash=plan.lock_hash, source=plan.source, image=plan.image,
                       wheels_bytes=wheels_bytes(TARGETS[plan.lock]),
                       size_bytes=built.size_bytes if built else None,
                       build_seconds=built.build_seconds if built else None,
                       serving_key=serving.key if serving else None,
                       serving_lock_hash=serving.lock_hash if serving else None,
                       serving_vllm_version=serving.vllm_version if serving else None,
                       serving_python=serving.python if serving else None)
