"""Access rules: loopback unless told otherwise, and an API key whenever the listener is reachable from elsewhere."""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from pathlib import Path

from documents.atomic import write_text_atomic


class AccessError(ValueError):
    """A listener that would be reachable beyond this machine without an API key."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_key_beyond_loopback(host: str, api_key: str | None, what: str = "server") -> None:
    if not is_loopback(host) and not api_key:
        raise AccessError(
            f"refusing to start the {what} on {host}: it is reachable beyond loopback and no API key is set "
            "(set the key's environment variable, or listen on 127.0.0.1 and use ssh -L)"
        )


def api_key_from_env(variable: str) -> str | None:
    value = os.environ.get(variable, "").strip()
    return value or None


def api_key_from_file(path: Path, create: bool) -> str:
    """The API key kept in `path` (one line); with `create`, a fresh key written there (mode 0600) when absent."""
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, secrets.token_urlsafe(32) + "\n", mode=0o600)
    key = path.read_text().strip()
    if not key:
        raise AccessError(f"{path}: the API key file is empty")
    return key


def bearer_matches(header: str | None, api_key: str) -> bool:
    """Constant-time check of an `Authorization: Bearer <key>` header."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), api_key.encode())
