"""Access rules: loopback unless told otherwise, and an API key whenever the listener is reachable from elsewhere."""

from __future__ import annotations

import hmac
import ipaddress
import os


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


def bearer_matches(header: str | None, api_key: str) -> bool:
    """Constant-time check of an `Authorization: Bearer <key>` header."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), api_key.encode())
