"""How a stack's price reads: the table `ftstack plan` prints and the JSON of `ftstack plan --json`, from the
`CostReport` of `infra.cost.price.price_stack`."""

from __future__ import annotations

from typing import Any

from infra.cost.tco import ChatScenario
from infra.cost.price import CostReport


def _usd(low: float, high: float) -> str:
    return f"${low:,.0f}" if round(low) == round(high) else f"${low:,.0f} to ${high:,.0f}"


def render_table(report: CostReport) -> str:
    m = report.monthly
    if not m.lines:
        return "Monthly cost: $0 (no cloud resources on this stack)"
    rows = [("Resource", "Size", "Price", "Monthly")]
    for line in m.lines:
        rows.append((line.label, line.quantity, line.unit_price, _usd(line.usd_low, line.usd_high)))
    if round(m.always_on_usd_low) == round(m.usd_low):
        rows.append(("Total monthly cost", "", f"{m.hours_per_month} h/month", _usd(m.usd_low, m.usd_high)))
    else:
        rows.append(("Total monthly cost, elastic workers (idle to all up)", "", f"{m.hours_per_month} h/month",
                     _usd(m.usd_low, m.usd_high)))
        rows.append(("Total monthly cost, every worker always on", "", f"{m.hours_per_month} h/month",
                     _usd(m.always_on_usd_low, m.always_on_usd_high)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    fmt = lambda r: "  " + "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    out = [f"Monthly cost (prices as of {m.pricing_date}; see planning/prices.py for sources):", fmt(rows[0])]
    out += [fmt(r) for r in rows[1:]]
    cats = ", ".join(f"{c} {_usd(lo, hi)}" for c, (lo, hi) in m.categories.items() if hi > 0)
    out.append(f"  by category: {cats}")
    t = report.training
    if t is not None:
        out.append("")
        if t.gpu_hours is None:
            out.append(f"Training run: {t.tokens * t.epochs:,.0f} tokens; throughput unknown, no cost estimate")
        elif t.usd is None:
            out.append(f"Training run ({t.throughput_kind}): {t.tokens * t.epochs:,.0f} tokens at "
                       f"{t.tokens_per_second_per_gpu:,.4g} tokens/s/GPU = {t.wall_hours:,.2f} h on {t.gpus} devices")
            out.append(f"  throughput: {t.throughput_source}")
        else:
            out.append(f"Training run ({t.throughput_kind}): {t.tokens * t.epochs:,.0f} tokens at "
                       f"{t.tokens_per_second_per_gpu:,.4g} tokens/s/GPU = {t.gpu_hours:,.1f} GPU-hours, "
                       f"{t.wall_hours:,.1f} h on {t.gpus} GPUs, ${t.usd:,.2f}")
            out.append(f"  throughput: {t.throughput_source}")
    if report.utilization is not None:
        out += ["", render_utilization(report)]
    if report.chats:
        out += ["", render_chat_table([*report.chats, *([report.measured_chat] if report.measured_chat else [])])]
    if report.notes:
        out += ["", *[f"note: {n}" for n in report.notes]]
    return "\n".join(out)


def render_utilization(report: CostReport) -> str:
    """Always-on beside the month at the stated schedule, with its basis."""
    u = report.utilization
    assert u is not None
    return "\n".join([
        "Monthly cost at measured utilization (elastic workers priced by the node-hour):",
        f"  always on                ${u.always_on_usd:,.0f}",
        f"  at the schedule          ${u.usd:,.0f}  ({u.worker_node_hours:,.1f} worker node-hours: "
        f"{u.runs_per_month:g} runs x {u.run_node_hours:,.2f} + serving "
        f"{u.worker_node_hours - u.runs_per_month * u.run_node_hours:,.0f})",
        f"  of which serving         ${u.serving_usd:,.0f}  ({u.serving_node_hours:,.0f} node-hours)",
        f"  basis: {u.basis}",
    ])


def training_cost_text(report: CostReport) -> str | None:
    """One line for the policies and the dashboard: the training run's cost, marked with what priced it."""
    t = report.training
    if t is None or t.usd is None:
        return None
    return f"training run ${t.usd:,.2f} ({t.wall_hours:,.1f} h on {t.gpus} GPUs), {t.throughput_source}"


def render_chat_table(chats: list[ChatScenario]) -> str:
    """Seed 000's cost-per-chat table: throughput, tokens and conversations per day, cost per chat."""
    out = ["Cost per chat (daily cost = monthly high / days per month):",
           "  Scenario        Tokens/s   Tokens/day  Conversations/day  Cost/chat"]
    for s in chats:
        out.append(f"  {s.name:<14}{s.tokens_per_second:>9g}{s.tokens_per_day:>13,.0f}"
                   f"{s.conversations_per_day:>19,.0f}  ${s.usd_per_chat:.2f}")
    return "\n".join(out)


def report_document(report: CostReport) -> dict[str, Any]:
    """JSON form for ``ftstack plan --json``: lines, categories, totals, training run, scenarios."""
    return {
        "monthly": report.monthly.model_dump(),
        "training_run": report.training.model_dump() if report.training else None,
        "cost_per_chat": [s.model_dump() for s in report.chats],
        "measured_chat": report.measured_chat.model_dump() if report.measured_chat else None,
        "utilization": report.utilization.model_dump() if report.utilization else None,
        "notes": report.notes,
    }
