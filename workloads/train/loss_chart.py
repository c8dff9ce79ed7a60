"""The loss-curve PNG of a training run, drawn from its metrics records."""

from __future__ import annotations

from pathlib import Path

from documents.atomic import atomic_file
from documents.metrics import load_metrics


def plot_loss(metrics: Path, png: Path) -> None:
    """Loss (and eval loss) against optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = load_metrics(metrics)
    train = [(r.step, r.loss) for r in rows if r.loss is not None]
    evals = [(r.step, r.eval_loss) for r in rows if r.eval_loss is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        ax.plot(*zip(*train), marker=".", label="train loss")
    if evals:
        ax.plot(*zip(*evals), marker="o", label="eval loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (assistant tokens)")
    ax.set_title(f"Training loss: {metrics.parent.name}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_file(png) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
