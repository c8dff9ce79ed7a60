"""The adapters a server may serve and the set one server serves: what `ftstack adapters` lists and what the
serve launcher writes beside its results (`served_adapters.json`), read by the stack outputs and the dashboard.

An adapter is named after a stored run; its base is the hash of the base model's weights the run trained on
(the run manifest's `base_model.sha256`), so that a server refuses an adapter of another base.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, Field

from documents.base import parse

SERVED_SET_NAME = "served_adapters.json"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""what serving needs of a PEFT adapter folder: what the run store keeps (`adapter/`) and what its hash covers"""


def adapter_sha256(folder: Path) -> str:
    """One hash over an adapter's config and weights (each file's name and bytes); OSError when one is missing."""
    return adapter_digest(lambda name: (folder / name).open("rb"))


def adapter_digest(open_file: Callable[[str], BinaryIO]) -> str:
    """`adapter_sha256` of the files `open_file(name)` gives (a server hashes the bytes it read and will load)."""
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        digest.update(name.encode() + b"\0")
        with open_file(name) as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


class EvalSummary(BaseModel):
    """The run's evaluation, as its run index stores it (assistant-token perplexity)."""

    model_config = ConfigDict(extra="forbid")

    perplexity_base: float | None = None
    perplexity_finetuned: float | None = None
    perplexity_improvement_pct: float | None = None


class AdapterEntry(BaseModel):
    """One stored run's LoRA adapter."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="model id clients ask for")
    run_id: str
    run_name: str | None = None
    stack: str | None = Field(None, description="the stack whose run store holds the run (runs/<stack>/<run_id>)")
    adapter_dir: str = Field(description="the adapter folder (PEFT layout) on the serving machine")
    base_model_sha256: str
    base_model_path: str | None = None
    rank: int | None = Field(None, ge=1, description="LoRA rank (r)")
    adapter_sha256: str | None = Field(None, description="adapter_sha256 of the folder, checked at every load")
    dataset_sha256: str | None = None
    evaluation: EvalSummary | None = None


class AdapterSpeed(BaseModel):
    """What one served name measured while serving."""

    model_config = ConfigDict(extra="forbid")

    requests: int = 0
    completion_tokens: int = 0
    tokens_per_second: float | None = None
    time_to_first_token_s: float | None = None


class ServedSet(BaseModel):
    """One server: its base and the adapters on it (as started; admin loads and unloads change it)."""

    model_config = ConfigDict(extra="forbid")

    base_name: str
    base_model_sha256: str
    base_model_path: str
    engine: str
    adapters: list[AdapterEntry] = []
    speed: dict[str, AdapterSpeed] = Field(default_factory=dict, description="by served name, base included")
    url: str | None = Field(None, description="where the gateway answers (http://<node>:<port>) when it listens "
                                              "beyond loopback: the publish job loads fine-tunes there")


def read_served_set(text: str | bytes, origin: str) -> ServedSet:
    return parse(ServedSet, text, origin, "served adapter set")


def write_served_set(served: ServedSet) -> str:
    return served.model_dump_json(indent=2) + "\n"
