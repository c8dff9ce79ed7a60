"""The evaluator report's comparison chart (base against fine-tuned), a PNG beside the report."""

from __future__ import annotations

from pathlib import Path

from documents.atomic import atomic_file
from documents.evaluator_report import EvaluatorReport


def write_chart(report: EvaluatorReport, path: Path) -> Path:
    """Four panels, base against fine-tuned: perplexity, tokens/s, time to first token, text scores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base, tuned = report.base_model, report.finetuned_model
    labels = ["base", f"fine-tuned ({report.finetuned_kind})"]
    colors = ["#7f8c8d", "#2e86de"]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    for ax, key, title in zip(
        axes[:3],
        ("perplexity", "tokens_per_second", "time_to_first_token"),
        ("perplexity (assistant tokens, lower is better)", "output tokens/s", "time to first token (s)"),
    ):
        values = [getattr(base, key), getattr(tuned, key)]
        ax.bar(labels, values, color=colors)
        ax.set_title(title, fontsize=10)
        for i, v in enumerate(values):
            ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=9)
    width = 0.38
    names = {"rouge_l": "ROUGE-L", "bleu": "BLEU", "chrf": "chrF", "exact_match": "exact", "numeric_match": "numeric"}
    scores = [k for k in names if getattr(base, k) is not None and getattr(tuned, k) is not None]
    xs = range(len(scores))
    axes[3].bar([x - width / 2 for x in xs], [getattr(base, k) for k in scores], width, label=labels[0], color=colors[0])
    axes[3].bar([x + width / 2 for x in xs], [getattr(tuned, k) for k in scores], width, label=labels[1], color=colors[1])
    axes[3].set_xticks(list(xs), [names[k] for k in scores])
    axes[3].set_title("scores against references (0-100)", fontsize=10)
    axes[3].legend(fontsize=8)
    fig.suptitle(f"run {report.run}: base vs fine-tuned (job {report.job_id})")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path
