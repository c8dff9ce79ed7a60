"""Static HTML dashboard of a stack: cost, cost per chat, node sets, filesystems, jobs, loss, comparison."""

from infra.dashboard.model import DashboardData, build
from infra.dashboard.render import render_html, write_dashboard

__all__ = ["DashboardData", "build", "render_html", "write_dashboard"]
