"""Pure metric functions: perplexity, text overlap scores, and the base-vs-fine-tuned comparison."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU, CHRF

SCORES = ("rouge_l", "bleu", "chrf")
ANSWER_SCORES = ("exact_match", "numeric_match")


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
    decode_speed          (ft - base) / base * 100        on decode_tokens_per_second, % (None when either lacks it)
    time_to_first_token   (ft - base) / base * 100        %, negative = faster first token
    message_length        (ft - base) / base * 100        on message_length_avg (characters), %
    message_tokens        (ft - base) / base * 100        on message_tokens_avg, %
    rouge_l, bleu, chrf   ft - base                       absolute points (0-100 scale)
    exact_match,          ft - base                       percentage points (None when either side lacks it)
    numeric_match
    """
    ppl = percent_change(base["perplexity"], finetuned["perplexity"])
    decode = base.get("decode_tokens_per_second"), finetuned.get("decode_tokens_per_second")
    result: dict[str, float | None] = {
        "perplexity": None if ppl is None else -ppl,
        "speed": percent_change(base["tokens_per_second"], finetuned["tokens_per_second"]),
        "decode_speed": None if None in decode else percent_change(*decode),
        "time_to_first_token": percent_change(base["time_to_first_token"], finetuned["time_to_first_token"]),
        "message_length": percent_change(base["message_length_avg"], finetuned["message_length_avg"]),
        "message_tokens": percent_change(base["message_tokens_avg"], finetuned["message_tokens_avg"]),
    }
    for name in SCORES:
        result[name] = finetuned[name] - base[name]
    for name in ANSWER_SCORES:
        b, t = base.get(name), finetuned.get(name)
        result[name] = None if b is None or t is None else t - b
    return result


# --- answer metrics for short (numeric) answers -------------------------------------------------------------

SCALES = {"thousand": 1e3, "k": 1e3, "million": 1e6, "mn": 1e6, "mm": 1e6, "m": 1e6, "billion": 1e9, "bn": 1e9,
          "b": 1e9, "trillion": 1e12, "tn": 1e12}
_NUMBER = re.compile(
    r"(?P<open>\()?(?P<sign>[-−])?\s*(?P<currency>[$€£¥])?\s*(?P<sign2>[-−])?"
    r"(?P<digits>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s*(?P<percent>%|percent\b|per cent\b))?"
    r"(?:\s*(?P<scale>thousand|million|billion|trillion|mn|mm|bn|tn|k|m|b)\b)?"
    r"(?P<close>\))?",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Number:
    """A number as written: its value with the scale word applied, and without it."""

    value: float
    mantissa: float
    scaled: bool
    percent: bool


def parse_numbers(text: str) -> list[Number]:
    """Every number in `text`: thousands separators, a leading minus or accounting parentheses for negatives,
    currency symbols, `%`/percent, and scale words (thousand, million/mn/m, billion/bn/b, trillion, k)."""
    numbers = []
    for match in _NUMBER.finditer(text):
        mantissa = float(match["digits"].replace(",", ""))
        if match["sign"] or match["sign2"] or (match["open"] and match["close"]):
            mantissa = -mantissa
        scale = SCALES[match["scale"].lower()] if match["scale"] else 1.0
        numbers.append(Number(mantissa * scale, mantissa, match["scale"] is not None, match["percent"] is not None))
    return numbers


def _close(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(abs(a), abs(b)) if a or b else True


def numeric_match(reference: str, generated: str, tolerance: float = 0.01) -> bool | None:
    """Whether the first number of `generated` equals the first number of `reference` within a relative
    `tolerance`; None when the reference has no number (not scored). Scale words count ("$1.2 million" is
    1,200,000); a figure quoted without the reference's scale word ("1,200" for "$1,200 million", as in a
    table headed "in millions") also matches."""
    wanted = parse_numbers(reference)
    if not wanted:
        return None
    found = parse_numbers(generated)
    if not found:
        return False
    want, got = wanted[0], found[0]
    if _close(want.value, got.value, tolerance):
        return True
    return want.scaled != got.scaled and _close(want.mantissa, got.mantissa, tolerance)


def normalize_answer(text: str) -> str:
    """Lower case, whitespace collapsed, surrounding quotes/spaces and a final full stop removed."""
    return " ".join(text.lower().split()).strip(" \"'`").removesuffix(".").strip()


def exact_match(reference: str, generated: str) -> bool:
    return normalize_answer(reference) == normalize_answer(generated)


def wilson_interval(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion, in percent."""
    if n <= 0:
        raise ValueError("no scored items: cannot compute an interval")
    p = hits / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)


def mean_interval(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """Normal-approximation 95% interval of a mean (sample standard deviation; zero width for one value)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values: cannot compute an interval")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean - z * sd / math.sqrt(n), mean + z * sd / math.sqrt(n)


def answer_scores(references: Sequence[str], generated: Sequence[str], tolerance: float) -> dict[str, Any]:
    """Exact match and numeric match in percent with the count behind each and its 95% Wilson interval,
    and the 95% interval of the per-prompt ROUGE-L mean."""
    n = len(references)
    exact = sum(exact_match(r, g) for r, g in zip(references, generated))
    numeric = [m for m in (numeric_match(r, g, tolerance) for r, g in zip(references, generated)) if m is not None]
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    rouge = [100.0 * scorer.score(r, g)["rougeL"].fmeasure for r, g in zip(references, generated)]
    return {
        "prompts_scored": n,
        "exact_match": 100.0 * exact / n,
        "exact_match_ci95": wilson_interval(exact, n),
        "numeric_scored": len(numeric),
        "numeric_match": 100.0 * sum(numeric) / len(numeric) if numeric else None,
        "numeric_match_ci95": wilson_interval(sum(numeric), len(numeric)) if numeric else None,
        "rouge_l_ci95": mean_interval(rouge),
    }
