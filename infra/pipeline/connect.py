"""A transport from the plain spec the dynamic providers keep in their inputs (local or SSH)."""

from __future__ import annotations

from collections.abc import Mapping

from infra.pipeline.ssh import SshTransport
from infra.pipeline.transport import LocalTransport, Transport


def open_transport(spec: Mapping[str, object]) -> Transport:
    """A transport from a plain spec: {"kind": "local"} or {"kind": "ssh", "host", "private_key", ...}
    (the other keys are SshTransport's keyword arguments). Used by the dynamic providers, whose inputs
    must be plain data."""
    kind = spec.get("kind", "local")
    if kind == "local":
        return LocalTransport()
    if kind == "ssh":
        options = {k: v for k, v in spec.items() if k != "kind" and v is not None}
        host = options.pop("host", None)
        if not host:
            raise ValueError("transport spec of kind 'ssh' needs 'host'")
        return SshTransport(str(host), **options)
    raise ValueError(f"transport kind must be 'local' or 'ssh', got {kind!r}")
