"""Metric functions: perplexity, text scores and the comparison formulas (checked against seed 000's figures)."""

from __future__ import annotations

import json
import math

import pytest

from workloads.eval.generation import read_prompts
from workloads.eval.metrics import compare, percent_change, perplexity, text_scores


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


def test_read_prompts_splits_reference_and_names_bad_row(tmp_path) -> None:
    good = {"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]}
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    first = read_prompts(path, 1)[0]
    assert (first.input, first.reference, first.messages) == ("Q?", "A.", good["messages"][:1])
    with pytest.raises(ValueError, match=r"test.jsonl: row 2"):
        read_prompts(path, 5)
