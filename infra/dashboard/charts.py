"""Dashboard charts as inline SVG (matplotlib, Agg; text kept as text, no external fonts)."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from documents.stack_outputs import MEASURED
from infra.dashboard.model import ChatRow, EvalTable, CostRow  # noqa: E402
from infra.monitoring.view import JobMetricsView  # noqa: E402

BLUE, ORANGE, GREY = "#2f6db3", "#e07b39", "#9aa5b1"
_STYLE = {
    "svg.fonttype": "none",
    "text.parse_math": False,
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def _svg(fig: plt.Figure, salt: str) -> str:
    buffer = io.StringIO()
    with plt.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    return re.sub(r'<svg ([^>]*?)width="[^"]*" height="[^"]*"', r'<svg \1class="chart"', text, count=1)


def _money(value: float) -> str:
    return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"


def cost_ranges(rows: Sequence[CostRow], title: str, salt: str) -> str:
    """Horizontal bars at the low figure, a lighter extension up to the high figure, labelled low-high."""
    with plt.rc_context(_STYLE):
        height = 0.9 + 0.32 * len(rows)
        fig, ax = plt.subplots(figsize=(7.2, height))
        labels = [r.label for r in rows][::-1]
        lows = [r.usd_low for r in rows][::-1]
        highs = [r.usd_high for r in rows][::-1]
        ax.barh(labels, lows, color=BLUE, label="low (autoscaling min)")
        ax.barh(labels, [h - l for l, h in zip(lows, highs)], left=lows, color=BLUE, alpha=0.35,
                label="up to high (autoscaling max)")
        top = max(highs) if highs else 1.0
        for y, (low, high) in enumerate(zip(lows, highs)):
            text = _money(low) if abs(high - low) < 0.005 else f"{_money(low)} - {_money(high)}"
            ax.text(high + top * 0.01, y, text, va="center", fontsize=8)
        ax.set_xlim(0, top * 1.3 or 1)
        ax.set_xlabel("USD per month")
        ax.set_title(title, loc="left", fontsize=10)
        if any(abs(h - l) >= 0.005 for l, h in zip(lows, highs)):
            ax.legend(loc="lower right", fontsize=7, frameon=False)
        return _svg(fig, salt)


def chat_costs(rows: Sequence[ChatRow], salt: str) -> str:
    shown = [r for r in rows if r.usd_per_chat is not None]
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(7.2, 0.9 + 0.35 * len(shown)))
        labels = [r.label for r in shown][::-1]
        values = [r.usd_per_chat for r in shown][::-1]
        colors = [ORANGE if r.name == MEASURED else BLUE for r in shown][::-1]
        ax.barh(labels, values, color=colors)
        top = max(values) if values else 1.0
        for y, value in enumerate(values):
            ax.text(value + top * 0.01, y, f"${value:,.4f}" if value < 0.01 else f"${value:,.2f}", va="center", fontsize=8)
        ax.set_xlim(0, top * 1.25 or 1)
        ax.set_xlabel("USD per chat")
        ax.set_title("Cost per chat by serving throughput", loc="left", fontsize=10)
        return _svg(fig, salt)


def loss_curve(train: Sequence[tuple[float, float]], evaluation: Sequence[tuple[float, float]], salt: str) -> str:
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(7.2, 3.2))
        ax.plot([s for s, _ in train], [l for _, l in train], color=BLUE, marker="o" if len(train) < 30 else None,
                markersize=3, label="train loss")
        if evaluation:
            ax.plot([s for s, _ in evaluation], [l for _, l in evaluation], color=ORANGE, marker="s", markersize=3,
                    label="eval loss")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title("Training loss", loc="left", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(frameon=False)
        return _svg(fig, salt)


def comparison_bars(result: EvalTable, salt: str) -> str:
    """One small panel per metric (four to a row), base in grey and fine-tuned in blue."""
    rows = [(m, b, t) for m, b, t, _ in result.metrics if b is not None and t is not None]
    ncols = min(len(rows), 4) or 1
    nrows = -(-len(rows) // ncols) or 1
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=(2.3 * ncols + 0.4, 2.5 * nrows), squeeze=False)
        flat = list(axes.flat)
        for ax, (metric, base, tuned) in zip(flat, rows):
            bars = ax.bar(["base", "fine-tuned"], [base, tuned], color=[GREY, BLUE])
            ax.bar_label(bars, labels=[f"{base:,.3g}", f"{tuned:,.3g}"], fontsize=8)
            ax.set_title(metric, fontsize=9)
            ax.set_ylim(0, max(base, tuned) * 1.2 or 1)
        for ax in flat[len(rows):]:
            ax.axis("off")
        fig.tight_layout()
        return _svg(fig, salt)


_JOB_PANELS = (("tokens_per_second", "Throughput (tokens/s)"), ("utilization_percent", "Utilization (%)"))


def job_metrics_over_time(view: JobMetricsView, salt: str) -> str:
    """Throughput and utilization of each job against minutes since the run's start, one line per job."""
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, len(_JOB_PANELS), figsize=(7.2, 2.8), squeeze=False)
        colors = [BLUE, ORANGE, GREY]
        for ax, (name, title) in zip(axes[0], _JOB_PANELS):
            for color, job in zip(colors * len(view.jobs), view.jobs):
                if series := job.figures.get(name):
                    device = series.labels.get("device")
                    minutes = [(p.time - view.start).total_seconds() / 60 for p in series.points]
                    ax.plot(minutes, [p.value for p in series.points], color=color, marker="o" if len(minutes) < 30
                            else None, markersize=3, label=f"{job.stage} {job.job_id}" + (f" ({device})" if device else ""))
            ax.set_title(title, loc="left", fontsize=10)
            ax.set_xlabel("minutes since the run started")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if ax.has_data():
                ax.legend(frameon=False, fontsize=7)
        fig.tight_layout()
        return _svg(fig, salt)
