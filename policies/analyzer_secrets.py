"""Secrets stay secret inside the pack: the engine sends a resource's secret properties under Pulumi's secret
signature (MarshalOptions KeepSecrets), and pulumi_policy's analyzer unwraps them to their plain values before any
policy sees them (policy.py: ``deserialize_properties`` without ``proxy_secrets``). A rule could then neither tell
a secret from a plain value (the pipeline's SSH key, a Pulumi secret, read as a plain private key) nor be kept from
printing one. Here every secret reaches the rules as ``[secret]``, as the mocks record it.
"""

from __future__ import annotations

from typing import Any

from pulumi_policy import deserialize
from pulumi_policy import policy as analyzer

from policies.rules import SECRET_PLACEHOLDER


def redacted(value: Any) -> Any:
    """A wire-format value with every secret replaced by ``[secret]``."""
    if isinstance(value, dict):
        if value.get(deserialize.SPECIAL_SIG_KEY) == deserialize.SPECIAL_SECRET_SIG:
            return SECRET_PLACEHOLDER
        return {key: redacted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redacted(item) for item in value]
    return value


def _deserialize_redacted(props: dict[str, Any], proxy_secrets: bool = False) -> dict[str, Any]:
    return deserialize.deserialize_properties(redacted(props), proxy_secrets)


def keep_secrets_secret() -> None:
    """Make the analyzer read every resource's (and provider's) properties with their secrets redacted."""
    analyzer.deserialize_properties = _deserialize_redacted
