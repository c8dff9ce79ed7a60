"""Dashboard data from real cost outputs and run artifacts (pure functions)."""

from __future__ import annotations

import pytest
from dashboard_fixtures import EVALUATOR, REPO, SAMPLE, stack_outputs
from document_fixtures import evaluator_report, side

from documents.metrics import MetricsRecord
from documents.prepare_summary import TokenizeLosses
from documents.run_record import RunIndex
from documents.stack_outputs import (
    Cost,
    EvalSide,
    Job,
    Pipeline,
    ServedAdapter,
    Serving,
    StackOutputs,
    parse_stack_outputs,
)
from infra.config import load_stack_config
from infra.cost import tco as cost
from infra.dashboard.model import StoredRun, build, chat_label, comparison, loss_curves
from infra.dashboard.render import render_html


@pytest.mark.parametrize("stack", ["demo", "dev", "h100"])
def test_sections_match_the_cost_model_and_the_program(stack: str) -> None:
    cfg = load_stack_config(stack, REPO / "stacks")
    monthly = cost.monthly_cost(cfg, cfg.pricing)
    outputs = stack_outputs(stack)
    data = build(stack, parse_stack_outputs(outputs, stack), cfg)
    assert data.target == "nebius"
    by_key = {line.key: line for line in monthly.lines}
    for row in data.lines:
        line = by_key[row.key]
        assert (row.label, row.category, row.quantity, row.unit_price) == (
            line.label, line.category, line.quantity, line.unit_price)
    assert data.monthly_low == pytest.approx(monthly.usd_low, abs=1e-3)
    assert data.monthly_high == pytest.approx(monthly.usd_high, abs=1e-3)
    assert sum(r.usd_low for r in data.categories) == pytest.approx(monthly.usd_low, abs=0.01)
    # a one-off line (the active checks after creation) is shown but is no part of the monthly total
    assert sum(r.usd_high for r in data.lines if r.category != cost.ONE_OFF) == pytest.approx(monthly.usd_high, abs=0.01)
    assert {r.key for r in data.lines} == {l.key for l in monthly.lines}
    assert {r.category for r in data.lines} <= {*cost.CATEGORIES, cost.ONE_OFF}
    assert [r.tokens_per_second for r in data.chats if r.name != "measured"] == sorted(cfg.pricing.chat.tokens_per_second)
    assert [(r.name, r.usd_per_chat) for r in data.chats][-1] == ("measured", None)  # no eval job reported yet
    if stack in ("demo", "dev"):  # L40S, no run of its own: priced with an estimate (h100's data size is unset)
        assert data.training_kind == "estimated" and data.training["usd"] > 0
        assert data.training_source.startswith("estimated from NVIDIA H100 SXM ")
        page = render_html(data, "test")
        assert '<span id="training-kind">(estimated)</span>' in page.split('id="monthly-cost"')[1].split("</div></div>")[1]
    workers = {w.name for w in cfg.nodes.workers}
    assert len(data.nodes) == len(workers) + 3 + (cfg.nodes.accounting is not None)
    # gpus_total counts every node a worker set may have (an ephemeral set's node group shows "0-5")
    assert sum(int(n.count.split("-")[-1]) * (n.gpus or 0) for n in data.nodes if n.gpus) == outputs["gpus_total"]
    assert data.nodes[0].gpus and data.nodes[0].platform == cfg.nodes.workers[0].platform
    system = next(n for n in data.nodes if n.role == "system")
    assert system.count == f"{cfg.nodes.system.min_size}-{cfg.nodes.system.max_size}"
    by_name = {f.name: f for f in data.filesystems}
    for sub in cfg.filesystems.submounts:
        assert by_name[sub.name].mount_path == sub.mount_path
        assert by_name[sub.name].size_gib == outputs[f"filesystem_jail_submount_{sub.name}_size_gib"]
    assert "jail" in by_name and data.jobs == [] and data.comparison is None and data.loss_curve == []
    assert data.other_outputs["cluster_name"] == cfg.cluster_name
    assert not any(k.startswith(("cost_", "node_group_", "filesystem_")) for k in data.other_outputs)


def test_local_stack_has_no_cloud_sections() -> None:
    cfg = load_stack_config("local", REPO / "stacks")
    data = build("local", parse_stack_outputs(stack_outputs("local"), "local"), cfg)
    assert data.target == "local"
    assert data.nodes == [] and data.filesystems == [] and data.categories == [] and data.lines == []
    assert data.monthly_high == 0 and data.chats == []


def test_run_sections_and_unknown_outputs() -> None:
    metrics = [MetricsRecord(step=1, epoch=0.5, loss=2.0), MetricsRecord(step=2, epoch=1, loss=1.5),
               MetricsRecord(step=2, epoch=1, eval_loss=1.7)]
    index = RunIndex(stack="local", run_id="r9", uploaded_at="2026-03-01T12:00:00+00:00",
                     job_ids={"train": "5", "eval": "6"}, job_states={"train": "COMPLETED"}, job_durations_s={"train": 61.0})
    run = StoredRun(index=index, metrics=metrics, evaluator=EVALUATOR)
    outputs = local_outputs(Pipeline(bundle_hash="abc", jobs={"train": Job(job_id="77", state="RUNNING")}))
    data = build("local", outputs, None, run)
    assert [(j.stage, j.job_id, j.state, j.duration_s) for j in data.jobs] == [("train", "77", "RUNNING", None)]
    assert data.other_outputs == {"cluster_name": "local", "pipeline_bundle_hash": "abc", "run_config": "local.json",
                                  "slurm_target": "local"}
    assert data.loss_curve == [(1.0, 2.0), (2.0, 1.5)] and data.eval_loss_curve == [(2.0, 1.7)]
    no_job_outputs = build("local", None, None, run)
    assert [(j.stage, j.state, j.duration_s) for j in no_job_outputs.jobs] == [
        ("train", "COMPLETED", 61.0), ("eval", "unknown", None)]
    result = comparison(EVALUATOR)
    label, base, tuned, change = result.metrics[0]
    assert label.startswith("Perplexity") and base == EVALUATOR.base_model.perplexity
    assert change == pytest.approx((tuned - base) / base * 100)
    assert result.samples == [SAMPLE]


def test_markup_in_a_sample_is_escaped_on_the_page() -> None:
    index = RunIndex(stack="local", run_id="r9", uploaded_at="2026-03-01T12:00:00+00:00")
    page = render_html(build("local", None, None, StoredRun(index=index, metrics=[], evaluator=EVALUATOR)), "test")
    assert "What does a &lt;b&gt;bond&lt;/b&gt; coupon mean?" in page and "<b>bond</b>" not in page


def test_helpers() -> None:
    assert chat_label("tps_3_8", 3.8) == "3.8 tokens/s" and chat_label("tps_200", 200.0) == "200 tokens/s"
    assert chat_label("measured", 41.0) == "Measured (fine-tuned model)"
    assert loss_curves([MetricsRecord(step=4, epoch=1, loss=3), MetricsRecord(step=4, epoch=1)]) == ([(4.0, 3.0)], [])


def local_outputs(pipeline: Pipeline) -> StackOutputs:
    return StackOutputs(stack="local", target="local", cluster_name="local", slurm_target="local",
                        run_config="local.json", pipeline=pipeline,
                        cost=Cost(monthly_usd_low=0, monthly_usd_high=0, hours_per_month=730, pricing_date="2026-01-01"))


def test_comparison_from_eval_outputs_when_no_run_is_stored() -> None:
    jobs = {"eval": Job(job_id="9", state="COMPLETED")}
    outputs = local_outputs(Pipeline(jobs=jobs, evaluation={
        "base": EvalSide(perplexity=7.5, time_to_first_token_s=0.2),
        "finetuned": EvalSide(perplexity=5.0, time_to_first_token_s=0.1)}))
    data = build("local", outputs)
    assert data.comparison is not None
    rows = {m: (b, t, c) for m, b, t, c in data.comparison.metrics}
    assert rows["Perplexity (lower is better)"] == (7.5, 5.0, pytest.approx(-100 / 3))
    assert rows["Time to first token (s)"][:2] == (0.2, 0.1) and "ROUGE-L" not in rows
    waiting = local_outputs(Pipeline(jobs=jobs, evaluation={"base": EvalSide(), "finetuned": EvalSide()}))
    assert build("local", waiting).comparison is None


def test_answer_metrics_carry_their_counts_and_data_losses_are_listed() -> None:
    report = evaluator_report("7", side(9.0, 20.0, exact_match=0.0, numeric_match=10.0, prompts_scored=20,
                                        numeric_scored=18),
                              side(6.0, 20.0, exact_match=45.0, numeric_match=60.0, prompts_scored=20, numeric_scored=18))
    report.data = {"train": TokenizeLosses(rows_read=2998, rows_kept=2990, truncated=1500, lost_fraction=0.0027,
                                           dropped={"overlong": 0, "answer_too_long": 8, "no_assistant_tokens": 0})}
    result = comparison(report)
    assert ("Exact match (%), n=20", 0.0, 45.0, None) in result.metrics
    assert ("Numeric match (%), n=18", 10.0, 60.0, pytest.approx(500.0)) in result.metrics
    assert result.data == [("train", 2998, 2990, 1500, "8 answer too long", pytest.approx(0.27))]


def test_served_adapters_section_lists_each_with_its_run_speed_and_cost() -> None:
    outputs = parse_stack_outputs(stack_outputs("local"), "local").model_copy(update={"serving": Serving(adapters={
        "desk-earnings": ServedAdapter(run_id="run-1", tokens_per_second=50.0, time_to_first_token_s=0.25,
                                       usd_per_chat=0.0123),
        "desk-credit": ServedAdapter(run_id="run-2")})})
    data = build("local", outputs)
    assert [(r.name, r.run_id, r.tokens_per_second, r.usd_per_chat) for r in data.adapters] == [
        ("desk-earnings", "run-1", 50.0, 0.0123), ("desk-credit", "run-2", None, None)]
    page = render_html(data, "test")
    section = page.split('id="served-adapters"', 1)[1].split("</section>", 1)[0]
    assert "desk-earnings" in section and "run-1" in section and "desk-credit" in section
    assert 'id="served-adapters"' not in render_html(build("local", parse_stack_outputs(stack_outputs("local"), "local")), "t")
