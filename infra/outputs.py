"""The flat stack outputs: every key and key pattern, and the one function that writes each group of them.

Writers: the Pulumi program (``infra/program.py``), ``ftstack run`` (its outputs file and the stored run's
``outputs.json``). Reader: the dashboard (``infra/dashboard/model.py``) through the patterns below. The README's
stack outputs contract lists every key; ``tests/test_outputs_contract.py`` holds the program to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from infra.cost import ChatScenario, MonthlyCost, TrainingRun, chat_scenarios
from infra.pricing import ChatAssumptions
from documents.evaluator_report import EvaluatorReport

SIDES = ("base", "finetuned")
EVAL_FIGURES: dict[str, str] = {
    "perplexity": "perplexity",
    "tokens_per_second": "tokens_per_second",
    "time_to_first_token_s": "time_to_first_token",
    "rouge_l": "rouge_l",
    "exact_match": "exact_match",
    "numeric_match": "numeric_match",
}
"""figure in the output key -> field of documents.evaluator_report.SideReport."""
JOB_FIELDS = ("job_id", "state", "elapsed_s")
CHAT_FIELDS = ("tokens_per_second", "conversations_per_day", "usd")
LINE_FIELDS = ("usd_low", "usd_high", "category", "label", "quantity", "unit_price")
TRAINING_FIELDS = ("tokens", "gpus", "tokens_per_second_per_gpu", "gpu_hours", "wall_hours", "usd", "throughput_source")
MEASURED = "measured"
"""the cost-per-chat scenario at the fine-tuned model's generation speed measured by the eval job."""
BUNDLE_HASH = "pipeline_bundle_hash"
MONTHLY_LOW, MONTHLY_HIGH = "cost_monthly_usd_low", "cost_monthly_usd_high"
HOURS_PER_MONTH, PRICING_DATE = "cost_hours_per_month", "cost_pricing_date"
ARTIFACTS_BUCKET = "artifacts_bucket_name"
NODE_GROUP_PREFIX, FILESYSTEM_PREFIX = "node_group_", "filesystem_"

CATEGORY = re.compile(r"^cost_category_(?P<name>.+)_usd_(?P<bound>low|high)$")
LINE = re.compile(rf"^cost_line_(?P<name>.+?)_(?P<field>{'|'.join(LINE_FIELDS)})$")
CHAT = re.compile(rf"^cost_per_chat_(?P<name>.+?)_(?P<field>{'|'.join(CHAT_FIELDS)})$")
TRAINING = re.compile(rf"^training_run_(?P<field>{'|'.join(TRAINING_FIELDS)})$")
JOB = re.compile(rf"^pipeline_(?P<stage>[a-z0-9]+)_(?P<field>{'|'.join(JOB_FIELDS)})$")
EVAL = re.compile(rf"^eval_(?P<figure>{'|'.join(EVAL_FIGURES)})_(?P<side>{'|'.join(SIDES)})$")


def flat_name(name: str) -> str:
    """A config name as it appears inside a key (node group, filesystem tag)."""
    return name.replace("-", "_")


def category_key(category: str, bound: str) -> str:
    return f"cost_category_{category}_usd_{bound}"


def line_key(line: str, field: str) -> str:
    return f"cost_line_{line}_{field}"


def chat_key(scenario: str, field: str) -> str:
    return f"cost_per_chat_{scenario}_{field}"


def training_key(field: str) -> str:
    return f"training_run_{field}"


def job_key(stage: str, field: str) -> str:
    return f"pipeline_{stage}_{field}"


def eval_key(figure: str, side: str) -> str:
    return f"eval_{figure}_{side}"


def node_group_key(group: str, field: str) -> str:
    return f"{NODE_GROUP_PREFIX}{flat_name(group)}_{field}"


def filesystem_key(tag: str, field: str) -> str:
    return f"{FILESYSTEM_PREFIX}{flat_name(tag)}_{field}"


def names(outputs: Mapping[str, Any], prefix: str, marker: str) -> list[str]:
    """Entity names of keys `<prefix><name>_<marker>` in output order (node groups, filesystems)."""
    return [k[len(prefix):-len(marker) - 1] for k in outputs if k.startswith(prefix) and k.endswith("_" + marker)]


def _round(value: float) -> float:
    return round(value, 4)


def chat_outputs(chats: Iterable[ChatScenario]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in chats:
        out[chat_key(s.name, "tokens_per_second")] = _round(s.tokens_per_second)
        out[chat_key(s.name, "conversations_per_day")] = _round(s.conversations_per_day)
        out[chat_key(s.name, "usd")] = _round(s.usd_per_chat)
    return out


def cost_outputs(monthly: MonthlyCost, training: TrainingRun | None, chats: Iterable[ChatScenario]) -> dict[str, float | str]:
    """Totals, categories, every cost line (figures and the labels the dashboard shows), the training run
    and the fixed cost-per-chat scenarios. Numbers are numbers; the pricing date and line texts are strings."""
    out: dict[str, float | str] = {
        MONTHLY_LOW: _round(monthly.usd_low),
        MONTHLY_HIGH: _round(monthly.usd_high),
        HOURS_PER_MONTH: monthly.hours_per_month,
        PRICING_DATE: monthly.pricing_date,
    }
    for category, (low, high) in monthly.categories.items():
        out[category_key(category, "low")] = _round(low)
        out[category_key(category, "high")] = _round(high)
    for line in monthly.lines:
        out[line_key(line.key, "usd_low")] = _round(line.usd_low)
        out[line_key(line.key, "usd_high")] = _round(line.usd_high)
        out[line_key(line.key, "category")] = line.category
        out[line_key(line.key, "label")] = line.label
        out[line_key(line.key, "quantity")] = line.quantity
        out[line_key(line.key, "unit_price")] = line.unit_price
    if training is not None:
        out[training_key("tokens")] = _round(training.tokens * training.epochs)
        out[training_key("gpus")] = training.gpus
        out[training_key("throughput_source")] = training.throughput_source
        for name in ("tokens_per_second_per_gpu", "gpu_hours", "wall_hours", "usd"):
            value = getattr(training, name)
            if value is not None:
                out[training_key(name)] = _round(value)
    out.update(chat_outputs(chats))
    return out


def measured_scenario(monthly: MonthlyCost, chat: ChatAssumptions, evaluation: EvaluatorReport | None
                      ) -> ChatScenario | None:
    """The `measured` scenario: the cluster's cost per chat at the fine-tuned model's generation speed
    from the eval job's report; None until the eval job reported (or when the stack costs nothing)."""
    if evaluation is None or monthly.usd_high <= 0 or evaluation.finetuned_model.tokens_per_second <= 0:
        return None
    scenarios = chat_scenarios(monthly, chat, evaluation.finetuned_model.tokens_per_second)
    return next(s for s in scenarios if s.name == MEASURED)


def measured_chat_outputs(monthly: MonthlyCost, chat: ChatAssumptions, evaluation: EvaluatorReport | None
                          ) -> dict[str, float | None]:
    """The `measured` scenario's keys; null until the eval job reported."""
    scenario = measured_scenario(monthly, chat, evaluation)
    if scenario is None:
        return {chat_key(MEASURED, field): None for field in CHAT_FIELDS}
    return chat_outputs([scenario])


def eval_outputs(evaluation: EvaluatorReport | None) -> dict[str, float | None]:
    """The evaluator's headline figures per side, flat; null until the eval job reported."""
    out: dict[str, float | None] = {}
    for side in SIDES:
        report = getattr(evaluation, f"{side}_model") if evaluation is not None else None
        for figure, field in EVAL_FIGURES.items():
            value = getattr(report, field) if report is not None else None
            out[eval_key(figure, side)] = float(value) if value is not None else None
    return out


def pipeline_keys(stages: Iterable[str]) -> list[str]:
    """The keys `pipeline_outputs` writes for these stages (known before any job ran)."""
    stages = list(stages)
    keys = [BUNDLE_HASH, *(job_key(stage, field) for stage in stages for field in JOB_FIELDS)]
    return keys + (list(eval_outputs(None)) if "eval" in stages else [])


def pipeline_outputs(bundle_hash: str | None, jobs: Mapping[str, Mapping[str, Any]],
                     evaluation: EvaluatorReport | None) -> dict[str, Any]:
    """The pipeline's outputs: bundle hash, each job's id, state and run time, and the evaluation figures.
    `jobs`: stage -> {job_id, state, elapsed_s} (SlurmJob outputs or the `ftstack run` state)."""
    out: dict[str, Any] = {BUNDLE_HASH: bundle_hash}
    for stage, job in jobs.items():
        for field in JOB_FIELDS:
            out[job_key(stage, field)] = job.get(field)
    if "eval" in jobs:
        out.update(eval_outputs(evaluation))
    return out
