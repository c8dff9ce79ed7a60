"""Nebius Object Storage as the program, the state backend and the runs store reach it: its S3 endpoint."""

from __future__ import annotations

import os
import re

S3_ENDPOINT_ENV = "FTSTACK_S3_ENDPOINT"


class StateError(RuntimeError):
    """The state backend cannot be set up as asked; the message says what to fix."""


def nebius_s3_endpoint(region: str) -> str:
    """The S3-compatible endpoint of Nebius Object Storage in `region` (FTSTACK_S3_ENDPOINT overrides)."""
    override = os.environ.get(S3_ENDPOINT_ENV)
    if override:
        return override.rstrip("/")
    if not re.fullmatch(r"[a-z0-9-]+", region or ""):
        raise StateError(f"nebius.region: {region!r} is not a region name such as 'eu-north1'")
    return f"https://storage.{region}.nebius.cloud"
