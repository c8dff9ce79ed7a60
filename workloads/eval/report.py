"""The evaluator's JSON document (documented keys) and its comparison chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.common.atomic import atomic_file, write_json_atomic

MODEL_KEYS = (
    "perplexity",
    "perplexity_tokens",
    "time_to_first_token",
    "tokens_per_second",
    "total_time",
    "message_length_avg",
    "message_tokens_avg",
    "rouge_l",
    "bleu",
    "chrf",
    "sample_generations",
)
COMPARISON_KEYS = (
    "perplexity",
    "speed",
    "time_to_first_token",
    "message_length",
    "message_tokens",
    "rouge_l",
    "bleu",
    "chrf",
)
TOP_KEYS = ("job_id", "run", "finetuned_kind", "base_model", "finetuned_model", "comparison", "settings")


def check_report(report: dict[str, Any]) -> None:
    """Raise ValueError naming the first missing key; the schema documented in docs/evaluation-and-serving.md."""
    for key in TOP_KEYS:
        if key not in report:
            raise ValueError(f"report: missing key {key!r}")
    for side in ("base_model", "finetuned_model"):
        for key in MODEL_KEYS:
            if key not in report[side]:
                raise ValueError(f"report: missing key {side}.{key}")
    for key in COMPARISON_KEYS:
        if key not in report["comparison"]:
            raise ValueError(f"report: missing key comparison.{key}")


def write_report(report: dict[str, Any], results_dir: Path) -> Path:
    path = results_dir / f"evaluator_{report['job_id']}.json"
    write_json_atomic(path, report)
    return path


def write_chart(report: dict[str, Any], path: Path) -> Path:
    """Four panels, base against fine-tuned: perplexity, tokens/s, time to first token, text scores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base, tuned = report["base_model"], report["finetuned_model"]
    labels = ["base", f"fine-tuned ({report['finetuned_kind']})"]
    colors = ["#7f8c8d", "#2e86de"]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    for ax, key, title in zip(
        axes[:3],
        ("perplexity", "tokens_per_second", "time_to_first_token"),
        ("perplexity (assistant tokens, lower is better)", "output tokens/s", "time to first token (s)"),
    ):
        values = [base[key], tuned[key]]
        ax.bar(labels, values, color=colors)
        ax.set_title(title, fontsize=10)
        for i, v in enumerate(values):
            ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=9)
    width = 0.38
    xs = range(3)
    axes[3].bar([x - width / 2 for x in xs], [base[k] for k in ("rouge_l", "bleu", "chrf")], width, label=labels[0], color=colors[0])
    axes[3].bar([x + width / 2 for x in xs], [tuned[k] for k in ("rouge_l", "bleu", "chrf")], width, label=labels[1], color=colors[1])
    axes[3].set_xticks(list(xs), ["ROUGE-L", "BLEU", "chrF"])
    axes[3].set_title("scores against references (0-100)", fontsize=10)
    axes[3].legend(fontsize=8)
    fig.suptitle(f"run {report['run']}: base vs fine-tuned (job {report['job_id']})")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path
