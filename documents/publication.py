"""What a publish job did (`<results_dir>/publication_<job id>.json`): the fine-tune loaded into the running server,
or why not. The publish job writes it and prints it; `ftstack run --wait` reads it back and reports it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

from documents.atomic import write_text_atomic
from documents.base import parse

LoadOutcome = Literal["loaded", "already loaded"]


class Publication(BaseModel):
    """Published (the model id, the load's outcome) or refused (the gate's reason), for one eval job's report."""

    model_config = ConfigDict(extra="forbid")

    published: bool
    eval_job: str
    """the eval job whose report was held against the gate."""
    reason: str | None = None
    """why not published (the gate's rule and the figure), when not."""
    model: str | None = None
    """the id the server lists the fine-tune under, when published."""
    stored: str | None = None
    """the run's folder in the serving run store."""
    server: str | None = None
    outcome: LoadOutcome | None = None

    @model_validator(mode="after")
    def _either_loaded_or_refused(self) -> Publication:
        if self.published and (self.model is None or self.outcome is None):
            raise ValueError("a published fine-tune names its model and the load's outcome")
        if not self.published and not self.reason:
            raise ValueError("a refused fine-tune says why")
        return self

    def text(self) -> str:
        if not self.published:
            return f"publish: not published ({self.reason})"
        return f"publish: {self.model} {self.outcome} into the server at {self.server} (stored in {self.stored})"


def publication_name(job_id: str) -> str:
    return f"publication_{job_id}.json"


def write_publication(publication: Publication, results_dir: Path, job_id: str) -> Path:
    path = results_dir / publication_name(job_id)
    write_text_atomic(path, publication.model_dump_json(indent=2))
    return path


def read_publication(text: str | bytes, origin: str) -> Publication:
    return parse(Publication, text, origin, "publish job's record")
