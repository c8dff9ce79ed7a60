"""The evaluator report (`<results_dir>/evaluator_<job id>.json`): its model, reader and writer.

`EvaluatorReport` is the one definition of the document; the eval job writes it (`write_report`), the operator's
side reads it with `read_evaluator_report`. New figures are new optional fields of `SideReport`
or `Comparison`; `version` changes only when an existing field changes meaning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict

from documents.atomic import write_text_atomic
from documents.base import Figures, parse
from documents.prepare_summary import TokenizeLosses

REPORT_VERSION = 1


class _Document(Figures):
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
    """median seconds to the first generated token over the timed runs (after a warm-up)."""
    tokens_per_second: float
    """median tokens per second (prefill included) of the timed single-prompt runs: it falls with shorter replies."""
    decode_tokens_per_second: float | None = None
    """median decode rate of the timed runs: tokens after the first over the seconds after the first token."""
    total_time: float
    """seconds generating every prompt took (warm-up, timed runs and batches)."""
    message_length_avg: float
    """mean reply length in characters."""
    message_tokens_avg: float
    """mean reply length in tokens."""
    rouge_l: float
    bleu: float
    chrf: float
    sample_generations: list[SampleGeneration] = []
    prompts_scored: int | None = None
    """prompts behind rouge_l, bleu, chrf and exact_match."""
    rouge_l_ci95: tuple[float, float] | None = None
    """95% interval of the per-prompt ROUGE-L mean (normal approximation)."""
    exact_match: float | None = None
    """% of replies equal to the reference (case, spacing and a final full stop ignored)."""
    exact_match_ci95: tuple[float, float] | None = None
    """95% Wilson interval, in %."""
    numeric_match: float | None = None
    """% of replies whose first number equals the reference's first number within settings.numeric_tolerance
    (scale words and units parsed); None when no reference has a number."""
    numeric_match_ci95: tuple[float, float] | None = None
    numeric_scored: int | None = None
    """prompts whose reference has a number (behind numeric_match)."""
    timing_runs: int | None = None
    """timed runs behind tokens_per_second and time_to_first_token."""


class Comparison(_Document):
    """Fine-tuned against base; formulas in workloads.eval.metrics.compare (None where the base is zero)."""

    perplexity: float | None
    speed: float | None
    decode_speed: float | None = None
    """on decode_tokens_per_second, %: the models' generation speed without the prefill and reply-length effect."""
    time_to_first_token: float | None
    message_length: float | None
    message_tokens: float | None
    rouge_l: float
    bleu: float
    chrf: float
    exact_match: float | None = None
    """fine-tuned - base, percentage points."""
    numeric_match: float | None = None
    """fine-tuned - base, percentage points."""


class EvalSettings(_Document):
    device: str
    dtype: str
    test_rows_perplexity: int
    prompts: int
    max_new_tokens: int
    seed: int
    decoding: str
    generation_batch_size: int | None = None
    numeric_tolerance: float | None = None


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
    data: dict[str, TokenizeLosses] | None = None
    """rows read, kept, truncated and dropped by reason when the train and test splits were tokenized."""
    inputs_sha256: str | None = None
    """digest of what the figures were measured on (workloads/eval/reuse.py): run config, model and test files,
    device; a later evaluation of the same inputs reuses this report's figures."""
    measured_by_job: str | None = None
    """the job that measured these figures, when this report reuses an earlier one's (else this report's job)."""


def report_name(job_id: str) -> str:
    """File name of a job's report in the results folder (the chart is the same name with .png)."""
    return f"evaluator_{job_id}.json"


def write_report(report: EvaluatorReport, results_dir: Path) -> Path:
    path = results_dir / report_name(report.job_id)
    write_text_atomic(path, report.model_dump_json(indent=2) + "\n")
    return path


def read_evaluator_report(text: str | bytes, origin: str) -> EvaluatorReport:
    return parse(EvaluatorReport, text, origin, "evaluator report")
