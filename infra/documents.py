"""The one reader of each document the pipeline's jobs write, on the operator's side.

Each document is one pydantic model defined next to its writer in ``workloads/``:

| document | model | reader |
| --- | --- | --- |
| ``evaluator_<job>.json`` | ``documents.evaluator_report.EvaluatorReport`` | ``read_evaluator_report`` |
| ``metrics.jsonl`` | ``documents.metrics.MetricsRecord`` (a line) | ``read_metrics`` |
| ``run_manifest.json`` | ``documents.run_manifest.RunManifest`` | ``read_run_manifest`` |
| ``readiness-<job>.json`` | ``workloads.checks.readiness.ReadinessReport`` | ``read_readiness_report`` |
| ``prepare.json`` | ``documents.prepare_summary.PrepareSummary`` | ``read_prepare_summary`` |

Every reader takes the text and where it came from (a path, an SSH path, an artifact key) and raises
``DocumentError`` naming that origin and the field (or line) at fault.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from workloads.checks.readiness import ReadinessReport
from documents.prepare_summary import PrepareSummary
from documents.evaluator_report import EvaluatorReport
from documents.run_manifest import RunManifest
from documents.metrics import MetricsRecord

Document = TypeVar("Document", bound=BaseModel)


class DocumentError(ValueError):
    """A document is not what its model says; the message names the origin and the field or line."""


def _fields(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}" for e in error.errors())


def _parse(model: type[Document], text: str | bytes, origin: str, what: str) -> Document:
    try:
        return model.model_validate_json(text)
    except ValidationError as error:
        raise DocumentError(f"{origin}: not a valid {what} ({_fields(error)})") from None


def read_evaluator_report(text: str | bytes, origin: str) -> EvaluatorReport:
    return _parse(EvaluatorReport, text, origin, "evaluator report")


def read_prepare_summary(text: str | bytes, origin: str) -> PrepareSummary:
    return _parse(PrepareSummary, text, origin, "prepare summary")


def read_run_manifest(text: str | bytes, origin: str) -> RunManifest:
    return _parse(RunManifest, text, origin, "run manifest")


def read_readiness_report(text: str | bytes, origin: str) -> ReadinessReport:
    return _parse(ReadinessReport, text, origin, "readiness report")


def read_metrics(text: str | bytes, origin: str, *, live: bool = False) -> list[MetricsRecord]:
    """Every record of a metrics.jsonl; a bad line is an error naming it, unless `live` (the tail of a file
    being written, whose first and last lines may be cut), where bad lines are skipped."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    records: list[MetricsRecord] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(MetricsRecord.model_validate_json(line))
        except ValidationError as error:
            if not live:
                raise DocumentError(f"{origin}:{number}: not a metrics record ({_fields(error)})") from None
    return records
