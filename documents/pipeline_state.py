"""`.local/pipeline/<stack>.json`: what `ftstack run` last saw of a stack's pipeline (bundle, data source, each
stage's job), so the next run submits only what changed. Written and read by `infra.pipeline.runner`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from documents.atomic import write_text_atomic
from documents.base import describe
from documents.evaluator_report import EvaluatorReport
from documents.publication import Publication
from documents.text_input import TextInputError, read_utf8


class SourceFingerprint(BaseModel):
    """What the pipeline state records of a `file:` source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    path: str
    size: int
    mtime: str
    sha256: str


class StageRecord(BaseModel):
    """A stage's provider outputs (its inputs included) as last seen."""

    stage: str
    outs: dict[str, Any]

    @field_validator("outs")
    @classmethod
    def _names_its_job(cls, outs: dict[str, Any]) -> dict[str, Any]:
        job_id = outs.get("job_id")
        if not isinstance(job_id, str) or not re.fullmatch(r"\d+", job_id):
            raise ValueError(f"'job_id' must be a Slurm job id such as \"1234\", got {job_id!r}")
        return outs


class PipelineState(BaseModel):
    stack: str
    slurm_env: dict[str, str] = {}
    started_at: str | None = None
    bundle: dict[str, Any] | None = None
    data_source: SourceFingerprint | None = None
    stages: dict[str, StageRecord] = {}
    evaluation: EvaluatorReport | None = None
    """the eval job's report, read once when the waited chain finished."""
    publication: Publication | None = None
    """the publish job's record (serving nodes), read with the report."""

    @field_validator("evaluation", mode="before")
    @classmethod
    def _summary_of_old_state(cls, value: Any) -> Any:
        """State written before the report was typed kept a flat summary: treated as not yet read."""
        return None if isinstance(value, dict) and "base_model" not in value else value


def load_state(path: Path, stack_name: str) -> PipelineState:
    if not path.exists():
        return PipelineState(stack=stack_name)
    try:
        state = PipelineState.model_validate_json(read_utf8(path))
    except TextInputError as error:
        raise ValueError(f"{error}; move it aside to start afresh (the jobs it recorded are not cancelled)") from None
    except ValidationError as error:
        problems = describe(error).replace("Value error, ", "")
        raise ValueError(f"{path}: damaged pipeline state: {problems}; move it aside to start afresh "
                         "(the jobs it recorded are not cancelled)") from None
    if state.stack != stack_name:
        raise ValueError(f"{path}: pipeline state of stack {state.stack!r}, not {stack_name!r}")
    return state


def save_state(path: Path, state: PipelineState) -> None:
    write_text_atomic(path, state.model_dump_json(indent=2), mode=0o600)
