"""The workloads' environment on a cluster: `<env root>/<key>/environment.json`, written last by the environment
stage (workloads.environment.build, standard library only: the cluster's bare Python runs it) before the folder is
renamed into place; readiness and the operator read it through this model."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from documents.base import parse

ENVIRONMENT_MANIFEST_NAME = "environment.json"
LOCK_COPY_NAME = "requirements.txt"
"""the lock as the environment was installed from, kept in its folder for readiness to compare against."""
EnvironmentSourceKind = Literal["index", "wheelhouse", "container"]


class EnvironmentManifest(BaseModel):
    """What one environment build made."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="<lock hash>-<cpXY>-<platform>: the folder's name under the environment root.")
    lock_hash: str
    source: EnvironmentSourceKind
    image: str | None = Field(None, description="The container image (container source).")
    python: str = Field(description="The interpreter's version, X.Y.Z.")
    platform: str
    installer: Literal["uv", "pip"]
    packages: dict[str, str] = Field(description="Installed distributions (normalized name -> version).")
    size_bytes: int = Field(ge=0)
    build_seconds: float = Field(ge=0)
    built_at: str
    job_id: str | None = None
    node: str


def read_environment_manifest(text: str | bytes, origin: str) -> EnvironmentManifest:
    return parse(EnvironmentManifest, text, origin, "environment manifest")


def write_environment_manifest(manifest: EnvironmentManifest) -> str:
    return json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
