"""Metric functions: perplexity, text scores and the comparison formulas (checked against seed 000's figures)."""

from __future__ import annotations

import math

import pytest

from workloads.eval.metrics import (answer_scores, compare, exact_match, mean_interval, numeric_match, parse_numbers,
                                    percent_change, perplexity, text_scores, wilson_interval)


def _side(ppl: float, tps: float, length: float, rouge: float = 10.0) -> dict[str, float]:
    return {
        "perplexity": ppl, "tokens_per_second": tps, "time_to_first_token": 0.5,
        "message_length_avg": length, "message_tokens_avg": length / 4, "rouge_l": rouge, "bleu": 1.0, "chrf": 20.0,
    }


def test_comparison_reproduces_seed_figures() -> None:
    base, tuned = _side(7.033111572265625, 200.0, 671.0), _side(4.704128742218018, 33.06, 125.1, rouge=25.0)
    result = compare(base, tuned)
    assert result["perplexity"] == pytest.approx(33.1145, abs=1e-3)
    assert result["message_length"] == pytest.approx(-81.356, abs=1e-3)
    assert result["speed"] == pytest.approx(-83.47, abs=1e-2)
    assert result["rouge_l"] == pytest.approx(15.0)
    assert result["time_to_first_token"] == 0.0
    assert result["decode_speed"] is None  # neither side measured it


def test_decode_speed_compares_the_rates_without_prefill() -> None:
    # the demo's case: the same decode rate, the fine-tuned replies half as long behind the same first-token time,
    # so the prefill-inclusive speed drops while the decode speed does not: 15 tokens in 0.85 + 14 / 20 s against
    # 7 tokens in 0.85 + 6 / 20 s
    base = {**_side(7.0, 15 / (0.85 + 14 / 20), 60.0), "decode_tokens_per_second": 20.0}
    tuned = {**_side(2.0, 7 / (0.85 + 6 / 20), 13.0), "decode_tokens_per_second": 20.0}
    result = compare(base, tuned)
    assert result["speed"] == pytest.approx((7 / 1.15 - 15 / 1.55) / (15 / 1.55) * 100)
    assert result["speed"] < -30 and result["decode_speed"] == 0.0


def test_percent_change_of_zero_baseline_is_none() -> None:
    assert percent_change(0.0, 3.0) is None


def test_perplexity_is_exp_mean_nll_and_rejects_no_tokens() -> None:
    assert perplexity(2 * math.log(5.0), 2) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="assistant"):
        perplexity(1.0, 0)


def test_text_scores_rank_closer_output_higher() -> None:
    refs = ["A bond pays fixed coupons until maturity.", "An ETF tracks an index."]
    close = text_scores(refs, ["A bond pays fixed coupons until it matures.", "An ETF tracks an index fund."])
    far = text_scores(refs, ["The weather is nice today.", "I like apples."])
    assert set(close) == {"rouge_l", "bleu", "chrf"}
    assert all(close[k] > far[k] for k in close)
    assert text_scores(refs, refs)["rouge_l"] == pytest.approx(100.0)


def test_numbers_are_parsed_with_signs_scales_and_units() -> None:
    values = [(n.value, n.percent) for n in parse_numbers(
        "Revenue rose 12.5% to $1.2 million; the loss was (1,234), net -$39 million, 3 bn and 4.5k; FY2021.")]
    assert values == [(12.5, True), (1_200_000.0, False), (-1234.0, False), (-39_000_000.0, False),
                      (3_000_000_000.0, False), (4_500.0, False), (2021.0, False)]


@pytest.mark.parametrize(("reference", "generated", "tolerance", "expected"), [
    ("$758 million", "$758 million", 0.01, True),
    ("$758 million", "The answer is 758 million dollars.", 0.01, True),
    ("$758 million", "758", 0.01, True),              # table figure quoted "in millions"
    ("$758 million", "$0.758 billion", 0.01, True),   # 758,000,000 either way
    ("$758 million", "$760 million", 0.01, True),     # 2/760 = 0.26% apart
    ("$758 million", "$760 million", 0.001, False),
    ("7.4%", "7.5%", 0.01, False),                    # 0.1/7.5 = 1.33% apart
    ("7.4%", "7.5%", 0.02, True),
    ("-$39 million", "$39 million", 0.01, False),     # sign counts
    ("-$39 million", "(39)", 0.01, True),
    ("$1,234 million", "In 2021 it was $1,234 million", 0.01, False),  # the first number is the year
    ("$5 million", "I cannot tell from the report.", 0.01, False),
    ("No change was reported.", "0", 0.01, None),     # no number in the reference: not scored
])
def test_numeric_match_known_cases(reference: str, generated: str, tolerance: float, expected: bool | None) -> None:
    assert numeric_match(reference, generated, tolerance) is expected


def test_exact_match_ignores_case_spacing_and_final_stop() -> None:
    assert exact_match("$758 million", "  $758  Million. ")
    assert not exact_match("$758 million", "$758 million dollars")


def test_answer_scores_counts_and_intervals() -> None:
    # 3 of 10 exact; numeric scored on the 9 references with a number, 4 of them matching
    references = ["$1 million"] * 3 + ["$2 million"] * 6 + ["none"]
    generated = ["$1 million"] * 3 + ["$2 million (approx.)"] + ["$9 million"] * 5 + ["x"]
    scores = answer_scores(references, generated, 0.01)
    assert scores["prompts_scored"] == 10 and scores["exact_match"] == pytest.approx(30.0)
    # Wilson 95% for 3/10, by hand: centre (0.3 + 1.96^2/20) / (1 + 1.96^2/10) = 0.35551,
    # half-width 1.96 * sqrt(0.021 + 0.009604) / 1.38416 = 0.24772
    assert scores["exact_match_ci95"] == pytest.approx((10.779, 60.323), abs=1e-3)
    assert scores["numeric_scored"] == 9 and scores["numeric_match"] == pytest.approx(400 / 9)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == pytest.approx(100.0)
    assert mean_interval([10.0, 20.0, 30.0]) == pytest.approx((20 - 1.96 * 10 / math.sqrt(3), 20 + 1.96 * 10 / math.sqrt(3)))


def test_comparison_of_answer_scores_is_in_points() -> None:
    base = {**_side(7.0, 10.0, 100.0), "exact_match": 0.0, "numeric_match": 12.5}
    tuned = {**_side(5.0, 10.0, 20.0), "exact_match": 40.0, "numeric_match": 50.0}
    result = compare(base, tuned)
    assert (result["exact_match"], result["numeric_match"]) == (40.0, 37.5)
    assert compare(_side(7.0, 10.0, 100.0), _side(5.0, 10.0, 20.0))["exact_match"] is None
