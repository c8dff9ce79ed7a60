"""`<checkpoint>/COMPLETE.json`: the seal a training attempt writes last into each checkpoint it saves (every
file with its size, the step, the training fingerprint); the next attempt resumes only from a checkpoint whose
files still match it (`workloads/train/checkpoints.py`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from documents.atomic import write_text_atomic
from documents.base import read_document

MARKER_NAME = "COMPLETE.json"


class CheckpointMarker(BaseModel):
    model_config = ConfigDict(frozen=True)

    step: int
    fingerprint: str | None = None
    """hash of what makes checkpoints interchangeable (model, data, method); None when not given."""
    files: dict[str, int]
    """every file of the checkpoint, relative to it, with its size in bytes."""
    sealed: str
    """UTC time the marker was written."""


def write_checkpoint_marker(folder: Path, marker: CheckpointMarker) -> None:
    write_text_atomic(folder / MARKER_NAME, marker.model_dump_json(indent=2) + "\n")


def read_checkpoint_marker(folder: Path) -> CheckpointMarker:
    """The marker of checkpoint `folder`, or a DocumentError naming the file and the field."""
    return read_document(CheckpointMarker, folder / MARKER_NAME, "checkpoint completion marker")
