"""The evaluator report (`<results_dir>/evaluator_<job id>.json`): its model, writer and comparison chart.

`EvaluatorReport` is the one definition of the document; the eval job writes it and the operator's side
reads it with `infra.documents.read_evaluator_report`. New figures are new optional fields of `SideReport`
or `Comparison`; `version` changes only when an existing field changes meaning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from workloads.common.atomic import atomic_file, write_text_atomic

REPORT_VERSION = 1


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SampleGeneration(_Document):
    input: str
    reference: str
    generated: str


class SideReport(_Document):
    """One model's figures on the test split."""

    perplexity: float
    """exp of the mean negative log-likelihood over assistant tokens."""
    perplexity_tokens: int
    """assistant tokens scored for the perplexity."""
    time_to_first_token: float
    """mean seconds to the first generated token."""
    tokens_per_second: float
    """generated tokens / generation seconds over every prompt."""
    total_time: float
    """generation seconds over every prompt."""
    message_length_avg: float
    """mean reply length in characters."""
    message_tokens_avg: float
    """mean reply length in tokens."""
    rouge_l: float
    bleu: float
    chrf: float
    sample_generations: list[SampleGeneration] = []


class Comparison(_Document):
    """Fine-tuned against base; formulas in workloads.eval.metrics.compare (None where the base is zero)."""

    perplexity: float | None
    speed: float | None
    time_to_first_token: float | None
    message_length: float | None
    message_tokens: float | None
    rouge_l: float
    bleu: float
    chrf: float


class EvalSettings(_Document):
    device: str
    dtype: str
    test_rows_perplexity: int
    prompts: int
    max_new_tokens: int
    seed: int
    decoding: str


class EvaluatorReport(_Document):
    """The eval job's result: both sides, the comparison and the settings they were measured with."""

    version: Literal[1] = REPORT_VERSION
    job_id: str
    run: str
    finetuned_kind: Literal["merged", "adapter"]
    base_model: SideReport
    finetuned_model: SideReport
    comparison: Comparison
    settings: EvalSettings


def report_name(job_id: str) -> str:
    """File name of a job's report in the results folder (the chart is the same name with .png)."""
    return f"evaluator_{job_id}.json"


def write_report(report: EvaluatorReport, results_dir: Path) -> Path:
    path = results_dir / report_name(report.job_id)
    write_text_atomic(path, report.model_dump_json(indent=2) + "\n")
    return path


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
    xs = range(3)
    scores = ("rouge_l", "bleu", "chrf")
    axes[3].bar([x - width / 2 for x in xs], [getattr(base, k) for k in scores], width, label=labels[0], color=colors[0])
    axes[3].bar([x + width / 2 for x in xs], [getattr(tuned, k) for k in scores], width, label=labels[1], color=colors[1])
    axes[3].set_xticks(list(xs), ["ROUGE-L", "BLEU", "chrF"])
    axes[3].set_title("scores against references (0-100)", fontsize=10)
    axes[3].legend(fontsize=8)
    fig.suptitle(f"run {report.run}: base vs fine-tuned (job {report.job_id})")
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path
