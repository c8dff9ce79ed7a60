"""Flat, numeric summaries of what the pipeline's jobs wrote, for stack outputs and dashboards."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

SUMMARY_KEYS = (
    "perplexity_base",
    "perplexity_finetuned",
    "tokens_per_second_base",
    "tokens_per_second_finetuned",
    "time_to_first_token_s_base",
    "time_to_first_token_s_finetuned",
    "rouge_l_base",
    "rouge_l_finetuned",
    "exact_match_base",
    "exact_match_finetuned",
    "numeric_match_base",
    "numeric_match_finetuned",
)


def evaluation_summary(report: Mapping[str, Any]) -> dict[str, float]:
    """The evaluator JSON's headline figures, flat: perplexity, tokens/s, TTFT, ROUGE-L per side, and exact and
    numeric match where the report has them."""
    sides = {"base": report["base_model"], "finetuned": report["finetuned_model"]}
    summary: dict[str, float] = {}
    for side, block in sides.items():
        summary[f"perplexity_{side}"] = float(block["perplexity"])
        summary[f"tokens_per_second_{side}"] = float(block["tokens_per_second"])
        summary[f"time_to_first_token_s_{side}"] = float(block["time_to_first_token"])
        summary[f"rouge_l_{side}"] = float(block["rouge_l"])
        for name in ("exact_match", "numeric_match"):
            if block.get(name) is not None:
                summary[f"{name}_{side}"] = float(block[name])
    return summary


def parse_evaluation(text: str, origin: str) -> dict[str, float]:
    """Summary of an evaluator JSON document; errors name the file."""
    try:
        return evaluation_summary(json.loads(text))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{origin}: not an evaluator report ({error})") from None
