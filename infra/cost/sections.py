"""The cost parts of the typed stack outputs (``documents.stack_outputs``): the month, the training run, the
cost-per-chat scenarios and each served adapter's cost per chat, rounded as the outputs carry them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from documents.adapter_registry import ServedSet
from documents.stack_outputs import ChatCost, Cost, ServedAdapter, Serving, UtilizationCost
from infra.cost.tco import ChatScenario, MonthlyCost, TrainingRun


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
        always_on_usd_low=_round(monthly.always_on_usd_low), always_on_usd_high=_round(monthly.always_on_usd_high),
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
