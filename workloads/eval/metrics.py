"""Pure metric functions: perplexity, text overlap scores, and the base-vs-fine-tuned comparison."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU, CHRF

SCORES = ("rouge_l", "bleu", "chrf")


def perplexity(total_nll: float, tokens: int) -> float:
    """exp of the mean negative log-likelihood per scored token."""
    if tokens <= 0:
        raise ValueError("no scored (assistant) tokens: cannot compute perplexity")
    return math.exp(total_nll / tokens)


def text_scores(references: Sequence[str], generated: Sequence[str]) -> dict[str, float]:
    """ROUGE-L F1 (mean over pairs, 0-100), corpus BLEU and corpus chrF (sacrebleu, 0-100)."""
    if len(references) != len(generated) or not references:
        raise ValueError(f"need equal, non-empty lists (got {len(references)} references, {len(generated)} outputs)")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    rouge = sum(scorer.score(r, g)["rougeL"].fmeasure for r, g in zip(references, generated)) / len(references)
    return {
        "rouge_l": 100.0 * rouge,
        "bleu": BLEU().corpus_score(list(generated), [list(references)]).score,
        "chrf": CHRF().corpus_score(list(generated), [list(references)]).score,
    }


def percent_change(before: float, after: float) -> float | None:
    """(after - before) / before * 100; None when `before` is zero."""
    return None if before == 0 else (after - before) / before * 100.0


def compare(base: Mapping[str, float], finetuned: Mapping[str, float]) -> dict[str, float | None]:
    """The `comparison` block; signs follow seed 000 (positive perplexity = fine-tuned is better).

    perplexity            (base - ft) / base * 100        improvement in %
    speed                 (ft - base) / base * 100        on tokens_per_second, %
    time_to_first_token   (ft - base) / base * 100        %, negative = faster first token
    message_length        (ft - base) / base * 100        on message_length_avg (characters), %
    message_tokens        (ft - base) / base * 100        on message_tokens_avg, %
    rouge_l, bleu, chrf   ft - base                       absolute points (0-100 scale)
    """
    ppl = percent_change(base["perplexity"], finetuned["perplexity"])
    result: dict[str, float | None] = {
        "perplexity": None if ppl is None else -ppl,
        "speed": percent_change(base["tokens_per_second"], finetuned["tokens_per_second"]),
        "time_to_first_token": percent_change(base["time_to_first_token"], finetuned["time_to_first_token"]),
        "message_length": percent_change(base["message_length_avg"], finetuned["message_length_avg"]),
        "message_tokens": percent_change(base["message_tokens_avg"], finetuned["message_tokens_avg"]),
    }
    for name in SCORES:
        result[name] = finetuned[name] - base[name]
    return result
