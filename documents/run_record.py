"""`run.json`: the index of one run stored in the run store (`runs/<stack>/<run_id>/run.json`).

Written last by `infra.runs.store.upload_run`, read by `ftstack runs`, `ftstack report`, the dashboard and the cost
model (the run's measured training throughput).
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, model_validator

from documents.base import Figures, parse
from documents.names import RunId, StackName
from documents.throughput import ThroughputCheck, ThroughputMeasurement


class RunIndex(Figures):
    """`run.json`: what `ftstack runs` shows without reading the other files."""

    model_config = ConfigDict(extra="forbid")

    stack: StackName
    run_id: RunId
    run_name: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    uploaded_at: str
    job_ids: dict[str, str] = {}
    job_states: dict[str, str] = {}
    job_durations_s: dict[str, float] = {}
    perplexity_base: float | None = None
    perplexity_finetuned: float | None = None
    perplexity_improvement_pct: float | None = None
    train_loss_final: float | None = None
    cost_usd: float | None = None
    files: list[str] = []
    adapter_sha256: str | None = None
    """the stored adapter's hash (documents.adapter_registry.adapter_sha256), what a server checks at load"""
    throughput: ThroughputMeasurement | None = None
    """the run's one throughput figure: real tokens over logged time for the whole run, per device, with its basis
    and provenance (what the stack's training-run cost is priced with)."""
    throughput_check: ThroughputCheck | None = None
    """the figure the stack was priced with before this run measured its own (estimate, measurement, ratio)."""

    @model_validator(mode="before")
    @classmethod
    def _drop_last_interval(cls, data: Any) -> Any:
        """Records written before 2026-11-25 also held `tokens_per_second`, the last logged interval's figure
        over all ranks: not the run's throughput, so it is read and dropped."""
        if isinstance(data, dict) and "tokens_per_second" in data:
            return {k: v for k, v in data.items() if k != "tokens_per_second"}
        return data


def read_run_record(text: str | bytes, origin: str) -> RunIndex:
    return parse(RunIndex, text, origin, "run index")


def write_run_record(index: RunIndex) -> str:
    return index.model_dump_json(indent=2) + "\n"
