"""A kubeconfig for an mk8s cluster that authenticates through the nebius CLI (exec credential)."""

from __future__ import annotations

import base64

import yaml

EXEC_API_VERSION = "client.authentication.k8s.io/v1beta1"
TOKEN_COMMAND = ("nebius", "mk8s", "v1", "cluster", "get-token", "--format", "json")


def kubeconfig(name: str, endpoint: str, ca_certificate_pem: str) -> str:
    """YAML kubeconfig with one cluster, one exec user and one current context, all called ``name``."""
    server = endpoint if endpoint.startswith("https://") else f"https://{endpoint}"
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_certificate_pem.encode()).decode(),
        }}],
        "users": [{"name": name, "user": {"exec": {
            "apiVersion": EXEC_API_VERSION,
            "command": TOKEN_COMMAND[0],
            "args": list(TOKEN_COMMAND[1:]),
            "interactiveMode": "Never",
        }}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    return yaml.safe_dump(document, sort_keys=False)
