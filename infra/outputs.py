"""Builders of the typed stack outputs (``documents.stack_outputs``) from the cost model, the job chain and the
evaluator report. Writers: the Pulumi program (``infra/program/build.py``) and ``ftstack run``; both flatten the same
``StackOutputs`` only when they export or write it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from documents.adapter_registry import ServedSet
from documents.evaluator_report import EvaluatorReport
from documents.stack_outputs import (SIDES, ChatCost, Cost, EvalSide, Job, Pipeline, ServedAdapter, Serving,
                                     UtilizationCost)
from infra.config import StackConfig
from infra.cost.tco import ChatScenario, MonthlyCost, TrainingRun

EVAL_FIGURES: dict[str, str] = {
    "perplexity": "perplexity",
    "tokens_per_second": "tokens_per_second",
    "time_to_first_token_s": "time_to_first_token",
    "rouge_l": "rouge_l",
    "exact_match": "exact_match",
    "numeric_match": "numeric_match",
}
"""EvalSide field -> field of documents.evaluator_report.SideReport."""


def _round(value: float) -> float:
    return round(value, 4)


def chat_cost(scenario: ChatScenario) -> ChatCost:
    return ChatCost(tokens_per_second=_round(scenario.tokens_per_second),
                    conversations_per_day=_round(scenario.conversations_per_day), usd=_round(scenario.usd_per_chat))


def cost_section(monthly: MonthlyCost, training: TrainingRun | None, chats: Iterable[ChatScenario],
                 used: UtilizationCost | None = None) -> Cost:
    """Totals, categories, every cost line (figures and the labels the dashboard shows), the training run, the
    fixed cost-per-chat scenarios and the month at measured utilization beside always-on."""
    return Cost(
        monthly_usd_low=_round(monthly.usd_low), monthly_usd_high=_round(monthly.usd_high),
        hours_per_month=monthly.hours_per_month, pricing_date=monthly.pricing_date,
        categories={name: {"usd_low": _round(low), "usd_high": _round(high)}
                    for name, (low, high) in monthly.categories.items()},
        lines={line.key: {"usd_low": _round(line.usd_low), "usd_high": _round(line.usd_high),
                          "category": line.category, "label": line.label, "quantity": line.quantity,
                          "unit_price": line.unit_price} for line in monthly.lines},
        chats={s.name: chat_cost(s) for s in chats},
        training=None if training is None else {
            "tokens": _round(training.tokens * training.epochs), "gpus": training.gpus,
            "throughput_source": training.throughput_source, "throughput_kind": training.throughput_kind,
            **{name: _round(value) for name in ("tokens_per_second_per_gpu", "gpu_hours", "wall_hours", "usd")
               if (value := getattr(training, name)) is not None},
        },
        utilization=None if used is None else used.model_copy(update={
            name: _round(getattr(used, name)) for name in (
                "always_on_usd", "usd", "runs_per_month", "run_node_hours", "serving_node_hours", "serving_usd",
                "worker_node_hours")}),
    )


def serving_section(adapter_chats: Mapping[str, ChatScenario], served: ServedSet) -> Serving:
    """Each served adapter with its measured speed and, where the price path priced it (a stack that costs
    something, an adapter that has been measured), its cost per chat at that speed."""
    adapters = {}
    for entry in served.adapters:
        speed = served.speed.get(entry.name)
        tokens_per_second = speed.tokens_per_second if speed else None
        chat = adapter_chats.get(entry.name)
        adapters[entry.name] = ServedAdapter(
            run_id=entry.run_id, usd_per_chat=_round(chat.usd_per_chat) if chat else None,
            tokens_per_second=_round(tokens_per_second) if tokens_per_second else None,
            time_to_first_token_s=_round(speed.time_to_first_token_s) if speed and speed.time_to_first_token_s else None)
    return Serving(adapters=adapters)


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
