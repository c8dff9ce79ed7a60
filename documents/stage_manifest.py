"""Stage manifests: what a stage made its output from, kept beside the output.

A folder keeps its manifest inside (``DIR/manifest.json``), a file beside it (``FILE.manifest.json``). Three
writers, three models:

| writer | model | readers |
| --- | --- | --- |
| data stages (sample, fetch, convert, split, tokenize) | ``StageManifest`` | the same stage (skip when current), evaluation (tokenize losses) |
| base-model preparation (``workloads.model.prepare``) | ``ModelManifest`` | preparation (skip when prepared), the run manifest (weights hash) |
| adapter merge (``workloads.train.export``) | ``MergedManifest`` | evaluation (reuse of a report), a person |

A manifest that cannot be read is treated as absent by the stage that would skip on it (the stage runs again);
``read_*`` raise ``DocumentError`` naming the file and the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from documents.atomic import write_text_atomic
from documents.base import DocumentError, parse

MANIFEST_NAME = "manifest.json"


def manifest_path(output: str | os.PathLike[str]) -> Path:
    """A folder keeps its manifest inside (`DIR/manifest.json`); a file beside it (`FILE.manifest.json`)."""
    output = Path(output)
    if output.is_dir() or not output.suffix:
        return output / MANIFEST_NAME
    return output.with_name(output.name + ".manifest.json")


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def json_text(self) -> str:
        return self.model_dump_json(indent=2, exclude_none=True) + "\n"


class FileDigest(_Manifest):
    path: str
    sha256: str


class StageManifest(_Manifest):
    """A data stage's output: its parameters and the sha256 of each input file, plus the stage's own counts."""

    stage: Literal["sample", "fetch", "convert", "split", "tokenize"]
    inputs: dict[str, FileDigest] = {}
    params: dict[str, Any] = {}
    created: str
    output_sha256: str | None = None
    """sample, fetch, convert, split: the output file's hash."""
    rows: int | None = None
    """convert, split: rows written."""
    skipped: int | None = None
    """convert: bad rows skipped."""
    model: str | None = None
    """tokenize: the tokenizer's folder."""
    rows_read: int | None = None
    rows_written: int | None = None
    truncated: int | None = None
    dropped_overlong: int | None = None
    dropped_answer_too_long: int | None = None
    dropped_no_assistant_tokens: int | None = None
    lost_fraction: float | None = None
    tokens: int | None = None
    max_tokens: int | None = None
    mean_tokens: float | None = None


class WeightFile(_Manifest):
    sha256: str
    bytes: int


class ModelManifest(_Manifest):
    """A prepared base model: where it came from, its dtype, parameter count and each weight file's hash."""

    source: str
    revision: str | None = None
    source_sha256: str | None = None
    """gguf sources: the GGUF file's hash."""
    requested_dtype: str
    dtype: str
    parameters: int
    weights: dict[str, WeightFile]
    created: str


class MergedManifest(_Manifest):
    """A servable model: the adapter and base it was merged from, or the full fine-tune it was exported from."""

    stage: Literal["export"] = "export"
    adapter: FileDigest | None = None
    trained: FileDigest | None = None
    """a full fine-tune's weights (the first safetensors file of its model folder)."""
    base: str
    dtype: str
    created: str


def read_stage_manifest(text: str | bytes, origin: str) -> StageManifest:
    return parse(StageManifest, text, origin, "stage manifest")


def read_model_manifest(text: str | bytes, origin: str) -> ModelManifest:
    return parse(ModelManifest, text, origin, "model manifest")


def load_stage_manifest(path: Path) -> StageManifest | None:
    """The manifest at `path`, None when absent or unreadable (the stage then runs again)."""
    try:
        return read_stage_manifest(path.read_bytes(), str(path))
    except (OSError, DocumentError):
        return None


def load_model_manifest(path: Path) -> ModelManifest | None:
    """The prepared model's manifest at `path`, None when absent or unreadable."""
    try:
        return read_model_manifest(path.read_bytes(), str(path))
    except (OSError, DocumentError):
        return None


def read_merged_manifest(text: str | bytes, origin: str) -> MergedManifest:
    return parse(MergedManifest, text, origin, "merged model manifest")


def load_merged_manifest(path: Path) -> MergedManifest | None:
    """The exported model's manifest at `path`, None when absent or unreadable."""
    try:
        return read_merged_manifest(path.read_bytes(), str(path))
    except (OSError, DocumentError):
        return None


def write_manifest(path: str | os.PathLike[str], manifest: StageManifest | ModelManifest | MergedManifest) -> None:
    write_text_atomic(path, manifest.json_text())
