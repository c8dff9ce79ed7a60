"""The one price path: `price_stack` prices a stack from its config and what its runs measured (training
throughput, the fine-tuned model's generation speed, the data size). The Pulumi program, `ftstack run`,
`ftstack plan`, `ftstack report` and the policy pack all call it, and nothing else calls the pieces of the cost
model (`infra.cost.tco`), the throughput estimator (`planning.throughput`) or the month at measured utilization
(`infra.cost.utilization`). The caller passes the run config it loaded (`infra.config.load_run`); nothing here reads
one from disk.

The training throughput, in this order: the stack's pricing.training.tokensPerSecondPerGpu; the newest run
measured on this stack (`PriceInputs.training`, read from the local store or the stack's artifacts bucket by
`infra.runs.measured.price_inputs`); a figure for the same GPU model, model and method measured elsewhere
(borrowed); else the estimate from the nearest measured figure (`planning.throughput.training_throughput`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from documents.evaluator_report import EvaluatorReport
from documents.prepare_summary import PrepareSummary
from documents.run_config import RunConfig
from documents.run_plan import RunPlan
from documents.sections.serve import ServeConfig
from documents.stack_outputs import MEASURED, ChatCost, Cost, UtilizationCost
from documents.throughput import ThroughputMeasurement
from infra.config import StackConfig
from infra.cost.tco import (
    ChatScenario,
    MonthlyCost,
    TrainingRun,
    chat_scenarios,
    monthly_cost,
    training_run,
    worker_node_hourly_usd,
)
from planning.prices import PriceBook
from infra.cost.sections import chat_cost, cost_section
from infra.cost.utilization import utilization
from infra.plans import stack_plan


class PriceInputs(BaseModel):
    """What a stack's price depends on beyond its config: what runs on it measured."""

    model_config = ConfigDict(frozen=True)

    training: ThroughputMeasurement | None = None
    """the newest training throughput a run on this stack measured."""
    training_read_from: str | None = None
    """the store `training` was read from (named in the source line)."""
    training_note: str | None = None
    """why no stored run was read (e.g. a bucket without credentials here)."""
    generation_tokens_per_second: float | None = None
    """the fine-tuned model's generation speed the eval job measured over its own replies (prefill included)."""
    generation_ttft_s: float | None = None
    """its median time to the first token."""
    generation_decode_tokens_per_second: float | None = None
    """its median decode speed (tokens after the first over the seconds after it)."""
    prepared: PrepareSummary | None = None
    """the run's prepare summary (the data size the training run is priced on)."""
    served_speeds: dict[str, float] = {}
    """the generation speed each served adapter measured, by served name (its cost per chat)."""
    stage_seconds: dict[str, float] = {}
    """each stage's elapsed seconds in the newest stored run (the month at measured utilization)."""
    stage_seconds_from: str | None = None
    """the run and store `stage_seconds` were read from."""
    stored_ranks: list[int] = []
    """the adapter rank of each stored run with an adapter (the runs a server of the stack may load)."""

    def with_evaluation(self, evaluation: EvaluatorReport | None) -> PriceInputs:
        """These inputs with the generation speed of the eval job's report (none before it reported)."""
        side = evaluation.finetuned_model if evaluation is not None else None
        speed = side.tokens_per_second if side is not None else 0
        return self.model_copy(update={
            "generation_tokens_per_second": speed if speed > 0 else None,
            "generation_ttft_s": side.time_to_first_token if side is not None else None,
            "generation_decode_tokens_per_second": side.decode_tokens_per_second if side is not None else None})

    def chat_speed(self, output_tokens: int) -> float | None:
        """The measured speed of one chat of `output_tokens` (the `measured` cost-per-chat scenario): its first
        token after the measured time to first token, the rest at the measured decode speed, so that the eval's
        reply lengths (a fine-tune's short answers) do not set the price; the overall speed where no decode
        speed was measured."""
        decode, ttft = self.generation_decode_tokens_per_second, self.generation_ttft_s
        if decode and ttft is not None:
            return output_tokens / (ttft + (output_tokens - 1) / decode)
        return self.generation_tokens_per_second


class CostReport(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    monthly: MonthlyCost
    training: TrainingRun | None
    chats: list[ChatScenario]
    measured_chat: ChatScenario | None
    notes: list[str]
    adapter_chats: dict[str, ChatScenario] = {}
    """each served adapter's cost per chat at its own measured speed (the `measured` scenario's arithmetic)."""
    utilization: UtilizationCost | None = None
    """the month at the stack's schedule with elastic workers priced by the hour (None without elastic workers)."""
    plan: RunPlan | None = None
    """the run's plan (infra.plans) that the training run and the month are priced from (None: no run config)."""

    def section(self) -> Cost:
        """The cost part of the stack outputs; stacks that price chats list the `measured` scenario after the
        fixed ones, null until an eval job measured the generation speed."""
        cost = cost_section(self.monthly, self.training, self.chats, self.utilization)
        if not cost.chats:
            return cost
        measured = chat_cost(self.measured_chat) if self.measured_chat is not None else ChatCost()
        return cost.model_copy(update={"chats": {**cost.chats, MEASURED: measured}})


def chat_output_tokens(run: RunConfig | None) -> int:
    """The output tokens a chat is priced at: what the run's server allows a reply (serve.max_tokens_limit; its
    default where the run config has no serve section or is not readable here)."""
    return ((run.serve if run is not None else None) or ServeConfig()).max_tokens_limit


def measured_plan(cfg: StackConfig, inputs: PriceInputs, run: RunConfig) -> RunPlan:
    """The run's plan (infra.plans.stack_plan) with what the stack's runs measured: the plan `price_stack` prices and
    the chain submits, without pricing the month."""
    return stack_plan(cfg, run, inputs.training, prepared=inputs.prepared, read_from=inputs.training_read_from,
                      stored_ranks=inputs.stored_ranks, stage_seconds=inputs.stage_seconds,
                      stage_seconds_from=inputs.stage_seconds_from)


def training_estimate(cfg: StackConfig, run: RunConfig | None, inputs: PriceInputs,
                      notes: list[str]) -> tuple[TrainingRun | None, RunPlan | None]:
    """The training run's tokens, passes, GPU hours and price as the run's plan has them (infra.plans), and the
    plan."""
    if run is None:
        notes.append(f"training run: run config {cfg.pipeline.run_config} not found here")
        return None, None
    plan = measured_plan(cfg, inputs, run)
    notes.extend(note for note in plan.notes if not note.startswith("refused: "))
    size, cost = plan.size, plan.cost("train")
    if size is None or cost is None:
        return None, plan
    return training_run(size, cost), plan


def price_stack(cfg: StackConfig, inputs: PriceInputs = PriceInputs(), run: RunConfig | None = None) -> CostReport:
    """Monthly TCO, the training run's cost and the cost-per-chat scenarios of a stack, from its config, the run
    config the caller loaded (`run`: the stack's pipeline.runConfig, or a variant of it as in the method comparison;
    None where it is not readable, and no training run is priced) and what its runs measured (`inputs`)."""
    book = PriceBook(cfg.pricing.overrides)
    monthly = monthly_cost(cfg, cfg.pricing, book)
    notes = [f"{line.label}: {line.note}" for line in monthly.lines if line.note]
    if inputs.training_note:
        notes.append(f"training throughput: {inputs.training_note}")
    training, plan = (training_estimate(cfg, run, inputs, notes) if cfg.target != "local"
                      else (None, measured_plan(cfg, inputs, run) if run is not None else None))
    output_tokens = chat_output_tokens(run)
    scenarios = chat_scenarios(monthly, cfg.pricing.chat, output_tokens, inputs.chat_speed(output_tokens)) \
        if monthly.usd_high > 0 else []
    if scenarios:
        notes.append(f"cost per chat: {output_tokens:,} output tokens a chat, what the server allows a reply "
                     "(serve.max_tokens_limit of the run config)")
    chats = [s for s in scenarios if s.name != MEASURED]
    measured = next((s for s in scenarios if s.name == MEASURED), None)
    adapter_chats = {name: scenario for name, speed in inputs.served_speeds.items() if monthly.usd_high > 0
                     for scenario in chat_scenarios(monthly, cfg.pricing.chat, output_tokens, speed)
                     if scenario.name == MEASURED}
    node_hour = worker_node_hourly_usd(cfg.nodes.workers[0], book) if cfg.nodes else 0.0
    used = utilization(cfg, monthly, node_hour, cfg.pricing.schedule, plan)
    return CostReport(monthly=monthly, training=training, chats=chats,
                      measured_chat=measured, notes=notes, adapter_chats=adapter_chats, utilization=used, plan=plan)
