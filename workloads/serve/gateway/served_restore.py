"""The served set across restarts.

An engine the supervisor restarts comes back with its start-up command's adapters only. Before the gateway
routes to it again, `resync` makes the engine hold exactly what the gateway lists for it: adapters loaded at
runtime are loaded again, start-up adapters unloaded since are unloaded again; an adapter whose files no longer
hash to what the registry recorded is refused and taken off the list. Until then the gateway answers that
engine's names with 503 and Retry-After (the supervisor's "restarting" state), never 404.

A launcher that starts again (a requeued Slurm job, or `--resume`) serves the set the last one persisted
(`served_adapters.json`), each adapter checked again against the run store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import httpx

from documents.adapter_registry import AdapterEntry, ServedSet, read_served_set
from documents.base import DocumentError
from workloads.serve.adapter_files import read_entry
from workloads.serve.engine_key import engine_headers
from workloads.serve.gateway.state import Gateway

log = logging.getLogger("workloads.serve")


def unchanged(entry: AdapterEntry) -> bool:
    """Whether the entry's files, read without following a link (none in a stored run), still hash as recorded."""
    try:
        return entry.adapter_sha256 is None or read_entry(entry).sha256 == entry.adapter_sha256
    except (OSError, ValueError):
        return False


def engine_folder(gateway: Gateway, entry: AdapterEntry) -> str | None:
    """The folder the engine loads `entry` from again; None when its files changed or cannot be read."""
    if not unchanged(entry):
        return None
    try:
        return gateway.adapter_host.engine_path(entry) if gateway.adapter_host else entry.adapter_dir
    except (OSError, ValueError):
        return None


def resync(gateway: Gateway, url: str, base_name: str, engine_key: str | None) -> list[str]:
    """Make the engine at `url` hold the adapters the gateway lists for it; returns the names refused (taken
    off the list: their files changed). Raises httpx.HTTPError when the engine refuses a load or unload."""
    listed = {name: route for name, route in list(gateway.routes.items())
              if route.url == url and route.adapter is not None}
    folders = {name: engine_folder(gateway, route.adapter) for name, route in listed.items()}
    refused = [name for name, folder in folders.items() if folder is None]
    for name in refused:
        gateway.routes.pop(name, None)
        del listed[name]
    with httpx.Client(base_url=url, headers=engine_headers(engine_key), timeout=300.0) as client:
        answer = client.get("/v1/models")
        answer.raise_for_status()
        held = {card["id"] for card in answer.json()["data"]} - {base_name}
        for name in sorted(held - {route.upstream for route in listed.values()}):
            client.post("/v1/unload_lora_adapter", json={"lora_name": name}).raise_for_status()
        for name, route in listed.items():
            if route.upstream not in held:
                client.post("/v1/load_lora_adapter", json={"lora_name": route.upstream,
                                                           "lora_path": folders[name]}).raise_for_status()
    if refused:
        gateway.on_change()
    return refused


def persisted_set(path: Path, base_sha: str, engine: str) -> ServedSet | None:
    """The set a launcher persisted for this base and engine, None when there is none."""
    try:
        served = read_served_set(path.read_bytes(), str(path))
    except (OSError, DocumentError):
        return None
    return served if served.base_model_sha256 == base_sha and served.engine == engine else None


def recheck(entries: list[AdapterEntry], check: Callable[[AdapterEntry], AdapterEntry]) -> list[AdapterEntry]:
    """The persisted adapters that still pass `check` (stored, same base, same files); each refusal logged."""
    kept = []
    for entry in entries:
        try:
            kept.append(check(entry))
        except ValueError as problem:  # RegistryError: not stored any more, another base, changed files
            log.warning("not serving %s again: %s", entry.name, problem)
    return kept
