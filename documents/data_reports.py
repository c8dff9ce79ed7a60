"""The data stages' reports: `FILE.report.json` beside the converted chat file (`workloads/data/convert.py`) and
`FILE_split.report.json` beside the split's input (`workloads/data/split.py`).

Each stage writes its report and, when its output is current, returns the stored one instead of redoing the
work; the prepare job folds both into its summary. `ConvertReport` and `SplitReport` are the one definition of
each file, `read_*`/`write_report` their one reader and writer.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from documents.atomic import write_text_atomic
from documents.base import read_document


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BadRow(_Report):
    row: int
    """1-based row (line) number in the input."""
    reason: str


class ConvertReport(_Report):
    input: str
    output: str
    rows_read: int
    rows_written: int
    rows_skipped: int
    skipped_by_reason: dict[str, int]
    first_bad_rows: list[BadRow]
    max_bad_fraction: float


class SplitReport(_Report):
    input: str
    train: str
    test: str
    rows: int
    train_rows: int
    test_rows: int
    groups: int
    train_groups: int
    test_groups: int
    duplicate_rows: int
    """rows identical to an earlier one (kept on the same side as it)."""
    duplicate_groups: int
    ratio: float
    shuffle: bool
    seed: int | None
    group_by: str | None = None


def convert_report_path(output: Path) -> Path:
    """Where the conversion report of the chat file `output` lives."""
    return output.with_name(output.stem + ".report.json")


def split_report_path(input_path: Path) -> Path:
    """Where the split report of the chat file `input_path` lives."""
    return input_path.with_name(f"{input_path.stem}_split.report.json")


def write_report(path: Path, report: ConvertReport | SplitReport) -> None:
    write_text_atomic(path, report.model_dump_json(indent=2) + "\n")


def read_convert_report(path: Path) -> ConvertReport:
    return read_document(ConvertReport, path, "conversion report")


def read_split_report(path: Path) -> SplitReport:
    return read_document(SplitReport, path, "split report")
