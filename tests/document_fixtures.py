"""Valid documents as the workloads write them, for tests of their readers (figures chosen per test)."""

from __future__ import annotations

from typing import Any

from workloads.eval.metrics import compare
from documents.evaluator_report import EvaluatorReport


def side(perplexity: float, tokens_per_second: float, **figures: Any) -> dict[str, Any]:
    """One side of an evaluator report; unnamed figures get plain values."""
    return {
        "perplexity": perplexity, "perplexity_tokens": 1200, "time_to_first_token": 0.05,
        "tokens_per_second": tokens_per_second, "total_time": 12.0, "message_length_avg": 240.0,
        "message_tokens_avg": 60.0, "rouge_l": 20.0, "bleu": 5.0, "chrf": 30.0, "sample_generations": [],
        "prompts_scored": 3, "exact_match": 0.0, "numeric_match": 50.0, "numeric_scored": 2,
        **figures,
    }


def evaluator_report(job_id: str = "41", base: dict[str, Any] | None = None,
                     finetuned: dict[str, Any] | None = None, run: str = "demo") -> EvaluatorReport:
    """An evaluator report whose comparison is computed from the two sides, as the eval job does."""
    base = base or side(12.0, 30.0)
    finetuned = finetuned or side(6.0, 28.0)
    return EvaluatorReport.model_validate({
        "job_id": job_id, "run": run, "finetuned_kind": "merged", "base_model": base, "finetuned_model": finetuned,
        "comparison": compare(base, finetuned),
        "settings": {"device": "cpu", "dtype": "float32", "test_rows_perplexity": 10, "prompts": 3,
                     "max_new_tokens": 16, "seed": 0, "decoding": "greedy"},
    })
