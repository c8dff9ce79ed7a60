"""Dashboard data from real cost outputs and run artifacts (pure functions)."""

from __future__ import annotations

import pytest
from dashboard_fixtures import EVALUATOR, REPO, cost_outputs

from infra import cost
from infra.config import load_stack_config
from infra.dashboard.model import build, chat_label, comparison, loss_curves, unwrap_outputs


@pytest.mark.parametrize("stack", ["demo", "dev", "h100"])
def test_cost_sections_match_the_cost_model(stack: str) -> None:
    cfg = load_stack_config(stack, REPO / "stacks")
    monthly = cost.monthly_cost(cfg, cfg.pricing)
    data = build(stack, cost_outputs(stack), cfg)
    assert data.monthly_low == pytest.approx(monthly.usd_low, abs=1e-3)
    assert data.monthly_high == pytest.approx(monthly.usd_high, abs=1e-3)
    assert sum(r.usd_low for r in data.categories) == pytest.approx(monthly.usd_low, abs=0.01)
    assert sum(r.usd_high for r in data.lines) == pytest.approx(monthly.usd_high, abs=0.01)
    assert {r.key for r in data.lines} == {l.key for l in monthly.lines}
    assert {r.category for r in data.lines} <= set(cost.CATEGORIES)
    assert [r.tokens_per_second for r in data.chats] == sorted(cfg.pricing.chat.tokens_per_second)
    assert len(data.nodes) == len(cfg.nodes.workers) + 3 + (cfg.nodes.accounting is not None)
    assert {f.name for f in data.filesystems} >= {"jail", *(s.name for s in cfg.filesystems.submounts)}
    assert data.jobs == [] and data.comparison is None and data.loss_curve == []
    assert data.other_outputs == {}


def test_local_stack_has_no_cloud_sections() -> None:
    cfg = load_stack_config("local", REPO / "stacks")
    data = build("local", {}, cfg)
    assert data.nodes == [] and data.filesystems == [] and data.categories == [] and data.monthly_high is None


def test_run_sections_and_unknown_outputs() -> None:
    metrics = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}, {"step": 2, "eval_loss": 1.7}, {"epoch": 1}]
    run = {"index": {"run_id": "r9", "job_ids": {"train": "5", "eval": "6"}, "job_states": {"train": "COMPLETED"},
                     "job_durations_s": {"train": 61.0}}, "metrics": metrics, "evaluator": EVALUATOR}
    data = build("local", {"clusterName": "local", "pipeline_job_train_id": "77", "pipeline_job_train_state": "RUNNING"},
                 None, None, run)
    assert [(j.stage, j.job_id, j.state) for j in data.jobs] == [("train", "77", "RUNNING")]
    assert data.other_outputs == {"clusterName": "local"}
    assert data.loss_curve == [(1.0, 2.0), (2.0, 1.5)] and data.eval_loss_curve == [(2.0, 1.7)]
    no_job_outputs = build("local", {}, None, None, run)
    assert [(j.stage, j.state, j.duration_s) for j in no_job_outputs.jobs] == [
        ("train", "COMPLETED", 61.0), ("eval", "unknown", None)]
    result = comparison(EVALUATOR)
    label, base, tuned, change = result.metrics[0]
    assert label.startswith("Perplexity") and base == EVALUATOR["base_model"]["perplexity"]
    assert change == pytest.approx((tuned - base) / base * 100)
    assert result.samples[0]["input"].startswith("Question:")


def test_helpers() -> None:
    assert chat_label("tps_3_8") == "3.8 tokens/s" and chat_label("tps_200") == "200 tokens/s"
    assert chat_label("measured") == "Measured"
    assert unwrap_outputs({"outputs": {"a": 1}}) == {"a": 1}
    with pytest.raises(ValueError, match="plan.json: expected a JSON object"):
        unwrap_outputs([1, 2], "plan.json")
    assert loss_curves([{"loss": 3}, {"loss": "x"}]) == ([(0.0, 3.0)], [])
