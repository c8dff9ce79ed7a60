"""Builders of the typed stack outputs (``documents.stack_outputs``) from the job chain and the evaluator report (the
cost sections: ``infra.cost.sections``). Writers: the Pulumi program (``infra/program/build.py``) and ``ftstack run``; both flatten the same
``StackOutputs`` only when they export or write it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from documents.adapter_registry import ServedSet
from documents.evaluator_report import EvaluatorReport
from documents.stack_outputs import SIDES, EvalSide, Job, Pipeline
from infra.config import StackConfig

EVAL_FIGURES: dict[str, str] = {
    "perplexity": "perplexity",
    "tokens_per_second": "tokens_per_second",
    "time_to_first_token_s": "time_to_first_token",
    "rouge_l": "rouge_l",
    "exact_match": "exact_match",
    "numeric_match": "numeric_match",
}
"""EvalSide field -> field of documents.evaluator_report.SideReport."""


def served_speeds(served: ServedSet | None) -> dict[str, float]:
    """The measured generation speed of each served adapter, by name (the price path's `served_speeds`)."""
    if served is None:
        return {}
    names = {entry.name for entry in served.adapters}
    return {name: s.tokens_per_second for name, s in served.speed.items() if name in names and s.tokens_per_second}


def eval_sides(evaluation: EvaluatorReport | None) -> dict[str, EvalSide]:
    """The evaluator's headline figures per side; null until the eval job reported."""
    sides: dict[str, EvalSide] = {}
    for side in SIDES:
        report = getattr(evaluation, f"{side}_model") if evaluation is not None else None
        sides[side] = EvalSide(**{figure: getattr(report, field) if report is not None else None
                                  for figure, field in EVAL_FIGURES.items()})
    return sides


def pipeline_section(bundle_hash: str | None, jobs: Mapping[str, Mapping[str, Any]],
                     evaluation: EvaluatorReport | None) -> Pipeline:
    """Bundle hash, each job's id, state and run time, and (with an eval stage) the evaluation figures.
    `jobs`: stage -> {job_id, state, elapsed_s} (SlurmJob outputs or the `ftstack run` state)."""
    return Pipeline(
        bundle_hash=bundle_hash,
        jobs={stage: Job(**{field: job.get(field) for field in Job.model_fields}) for stage, job in jobs.items()},
        evaluation=eval_sides(evaluation) if "eval" in jobs else None,
    )


def stack_identity(cfg: StackConfig) -> dict[str, str]:
    """What every stack reports about itself, local included."""
    return {
        "stack": cfg.stack,
        "target": cfg.target,
        "cluster_name": cfg.cluster_name,
        "slurm_target": {"local": "local", "cluster": "existing"}.get(cfg.target, "soperator"),
        "run_config": cfg.pipeline.run_config,
    }
