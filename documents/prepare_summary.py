"""The prepare stage's summary (`<results_dir>/prepare.json`): where every row went, per step.

Written by `workloads.prepare`; read on the operator's side by `read_prepare_summary`
(`ftstack run` prints it) and copied into the evaluator report (`EvaluatorReport.data`), so stored run
artifacts and the dashboard show the same counts.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from documents.atomic import write_text_atomic
from documents.base import parse


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConvertLosses(_Document):
    rows_read: int
    rows_kept: int
    skipped: dict[str, int]
    """bad rows by reason (user_missing, invalid_json, ...)."""


class SplitCounts(_Document):
    train_rows: int
    test_rows: int
    groups: int
    train_groups: int
    test_groups: int
    group_by: str | None
    duplicate_rows: int


class TokenizeLosses(_Document):
    rows_read: int
    rows_kept: int
    truncated: int
    """rows kept with a shortened context (overlong context) or cut at the end (overlong truncate)."""
    dropped: dict[str, int]
    """rows dropped by reason: overlong, answer_too_long, no_assistant_tokens."""
    lost_fraction: float
    mean_tokens: float | None = None


class DataSettings(_Document):
    max_length: int
    overlong: str
    max_lost_fraction: float
    max_bad_fraction: float
    group_by: str | None


class PrepareSummary(_Document):
    base_model_dir: str
    parameters: int | None
    conversations: str
    convert: ConvertLosses
    split: SplitCounts
    tokenized: dict[str, TokenizeLosses]
    """per side: train, test."""
    train_tokenized_dir: str
    test_tokenized_dir: str
    settings: DataSettings

    def lines(self) -> list[str]:
        """Human-readable loss accounting, one line per step."""
        skipped = sum(self.convert.skipped.values())
        out = [f"convert: {self.convert.rows_read} rows read, {self.convert.rows_kept} kept, {skipped} skipped"
               + _by_reason(self.convert.skipped),
               f"split: {self.split.train_rows} train / {self.split.test_rows} test rows; {self.split.groups} groups "
               f"({self.split.train_groups} / {self.split.test_groups})"
               + (f" by {self.split.group_by}" if self.split.group_by else "")]
        for side, t in self.tokenized.items():
            out.append(f"tokenize {side}: {t.rows_read} read, {t.rows_kept} kept, {t.truncated} truncated "
                       f"(overlong {self.settings.overlong}, max_length {self.settings.max_length}), dropped "
                       f"{sum(t.dropped.values())}{_by_reason(t.dropped)}, lost {t.lost_fraction:.1%} "
                       f"(limit {self.settings.max_lost_fraction:.0%})")
        return out


def _by_reason(counts: dict[str, int]) -> str:
    """" (answer too long 3, overlong 1)" for the reasons that lost rows; nothing when none did."""
    lost = [f"{reason.replace('_', ' ')} {count}" for reason, count in sorted(counts.items()) if count]
    return f" ({', '.join(lost)})" if lost else ""


SUMMARY_NAME = "prepare.json"


def write_summary(summary: PrepareSummary, results_dir: Path) -> Path:
    path = results_dir / SUMMARY_NAME
    write_text_atomic(path, summary.model_dump_json(indent=2) + "\n")
    return path


def read_prepare_summary(text: str | bytes, origin: str) -> PrepareSummary:
    return parse(PrepareSummary, text, origin, "prepare summary")
