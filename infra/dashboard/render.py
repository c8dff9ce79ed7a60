"""Render DashboardData into one self-contained HTML file (inline CSS and SVG; nothing fetched)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from documents.atomic import write_text_atomic
from infra.dashboard import charts
from infra.dashboard.model import CATEGORY_LABELS, DashboardData

PAGE_NAME = "index.html"


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.0f}"


def _money2(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _chat_money(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.4f}" if value < 0.01 else f"${value:,.2f}"


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _fmt0(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("infra.dashboard", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(
        money=_money, money2=_money2, chat_money=_chat_money, fmt=_fmt, fmt0=_fmt0, duration=_duration,
        category_label=lambda c: CATEGORY_LABELS.get(c, c),
    )
    return env


def chart_svgs(data: DashboardData) -> dict[str, str]:
    out = {"categories": "", "lines": "", "chats": "", "loss": "", "comparison": "", "jobs": ""}
    if data.categories:
        out["categories"] = charts.cost_ranges(data.categories, "By category", "categories")
    if data.lines:
        out["lines"] = charts.cost_ranges(data.lines, "By line", "lines")
    if any(r.usd_per_chat is not None for r in data.chats):
        out["chats"] = charts.chat_costs(data.chats, "chats")
    if data.loss_curve:
        out["loss"] = charts.loss_curve(data.loss_curve, data.eval_loss_curve, "loss")
    if data.comparison and any(b is not None and t is not None for _, b, t, _ in data.comparison.metrics):
        out["comparison"] = charts.comparison_bars(data.comparison, "comparison")
    if data.job_metrics and data.job_metrics.jobs:
        out["jobs"] = charts.job_metrics_over_time(data.job_metrics, "jobs")
    return out


def render_html(data: DashboardData, source: str) -> str:
    ppl = next((m for m in (data.comparison.metrics if data.comparison else []) if m[0].startswith("Perplexity")), None)
    other = {k: _value(v) for k, v in data.other_outputs.items()}
    view = DashboardData(**{**data.__dict__, "other_outputs": other})
    return _environment().get_template("dashboard.html.j2").render(
        d=view,
        charts=chart_svgs(data),
        ppl=ppl,
        source=source,
        generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )


class DashboardWriteError(ValueError):
    """The page cannot be written where asked; the message names the path and the cause."""


def write_dashboard(data: DashboardData, out_dir: Path, source: str) -> Path:
    """Write `<out_dir>/index.html` atomically (temp file in the same folder, then rename)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise DashboardWriteError(f"{out_dir}: exists and is not a folder (the dashboard is written into a folder "
                                  f"as {PAGE_NAME})")
    page = render_html(data, source)
    target = out_dir / PAGE_NAME
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(target, page)
    except OSError as error:
        raise DashboardWriteError(f"{error.filename or out_dir}: cannot write the dashboard: "
                                  f"{error.strerror or error}") from None
    return target
