"""One price path (issue 31 item 4) and a run that measures what its stack was priced with by estimate (issue 34).

The `dev` stack (1 L40S, QLoRA of Qwen3-14B) has no throughput of its own: it is priced with the estimate from
the H100 bench row. A finished run on it (its training records, its evaluator report, fetched through the local
transport) is stored in the stack's artifacts bucket (a real S3 server on loopback); its run record keeps the
estimate, the measurement and their ratio; the program under mocks, `ftstack plan` and what `ftstack run`
wrote then price the training run alike, with the measurement, read from the bucket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from artifacts_fixtures import KEYS, S3Server, s3_server  # noqa: F401
from document_fixtures import evaluator_report, side

from documents.metrics import MetricsRecord
from documents.throughput import bench_throughputs
from infra.commands.run import evaluation_summary_text, finish_run
from infra.commands.runs import format_table
from infra.config import load_run, load_stack_config
from infra.cost.price import price_stack
from infra.pipeline.runner import PipelineRun
from infra.runs.measured import price_inputs, stack_store
from infra.runs.store import list_runs

REPO = Path(__file__).resolve().parent.parent
STEP_TOKENS, STEP_TPS, STEPS = 8192, 1600.0, 5


@pytest.fixture
def dev_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {"FTSTACK_S3_ENDPOINT": s3_server.endpoint, "FTSTACK_ARTIFACTS_BUCKET": s3_server.new_bucket(),
           "AWS_ACCESS_KEY_ID": KEYS["access_key_id"], "AWS_SECRET_ACCESS_KEY": KEYS["secret_access_key"]}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def finished_run(work: Path) -> PipelineRun:
    """The dev run's folders as the train and eval jobs leave them, and the chain's state once waited."""
    train, results = work / "train", work / "results"
    train.mkdir(parents=True)
    results.mkdir()
    config = json.loads((REPO / "workloads/configs/dev.json").read_text())
    manifest = {"version": 1, "run": "dev", "config_sha256": "0" * 64, "config": config, "precision": "bf16",
                "dataset": {"path": "/mnt/data/dev/train", "sha256": "1" * 64},
                "base_model": {"path": "/mnt/model/qwen3-14b", "sha256": "2" * 64, "from": "computed"},
                "packages": {}, "world_size": 1, "nodes": 1, "started": "2026-11-25T10:00:00+00:00",
                "ended": "2026-11-25T10:05:00+00:00", "status": "completed", "device": "NVIDIA L40S",
                "device_kind": "gpu",
                "batch_plan": {"micro_batch_tokens": 1024, "gradient_accumulation_steps": 8,
                               "gradient_checkpointing": True, "step_tokens": 8192, "estimate_gib": 14.0,
                               "gpu_memory_gib": 48, "memory_fraction": 0.9, "source": "config"}}
    (train / "run_manifest.json").write_text(json.dumps(manifest))
    records = [MetricsRecord(step=s, epoch=s / 100, loss=2.0 - s / 10, tokens=STEP_TOKENS, tokens_per_second=STEP_TPS)
               for s in range(1, STEPS + 1)]
    (train / "metrics.jsonl").write_text("".join(r.line() for r in records))
    report = evaluator_report("204", side(9.0, 20.0), side(6.0, 35.0), run="dev")
    (results / "evaluator_204.json").write_text(report.model_dump_json())
    jobs = {stage: {"job_id": str(201 + i), "state": "COMPLETED", "exit_code": 0, "elapsed_s": 60.0,
                    "results_path": str(results)} for i, stage in enumerate(("prepare", "readiness", "train", "eval"))}
    jobs["train"]["results_path"] = str(train)
    return PipelineRun(stack="dev", started_at="2026-11-25T09:58:00+00:00", bundle_hash="0123456789abcdef",
                       submitted=list(jobs), kept=[], jobs=jobs, evaluation=report)


def plan_json(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "infra.commands.cli", "plan", "--stack", "dev", "--json"],
                          cwd=REPO, env={**os.environ, **env, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_measured_run_replaces_the_estimate_in_every_price_of_the_stack(dev_bucket, tmp_path: Path) -> None:
    cfg = load_stack_config("dev", REPO / "stacks")
    before = price_stack(cfg, price_inputs(cfg, REPO), load_run(cfg, REPO))
    assert before.training.throughput_kind == "estimated"
    estimate = before.training.tokens_per_second_per_gpu

    result = finished_run(tmp_path / "cluster")
    inputs = price_inputs(cfg, REPO).with_evaluation(result.evaluation)
    outputs, report, where = finish_run(cfg, REPO, result, {"kind": "local"}, inputs)
    assert where is not None and dev_bucket["FTSTACK_ARTIFACTS_BUCKET"] in where

    store, _ = stack_store(cfg, REPO)
    record = list_runs(store, "dev")[-1]
    assert record.throughput.tokens_per_second_per_device == pytest.approx(STEP_TPS)  # every step ran at 1,600/s
    check = record.throughput_check
    assert (check.priced_kind, check.priced_tokens_per_second_per_gpu) == ("estimated", pytest.approx(estimate))
    assert check.priced_source.startswith("estimated from NVIDIA H100 SXM ")
    assert check.measured_tokens_per_second_per_gpu == pytest.approx(STEP_TPS)
    assert check.ratio == pytest.approx(STEP_TPS / estimate, rel=1e-3)
    table = format_table(list_runs(store, "dev")).splitlines()
    assert "train measured/priced" in table[0] and f" {check.ratio:,.2f} " in table[-1]

    ran = outputs.cost.training
    assert ran.throughput_kind == "measured" and ran.tokens_per_second_per_gpu == pytest.approx(STEP_TPS)
    assert record.run_id in ran.throughput_source and "read from s3://" in ran.throughput_source
    # the measured cost per chat is in the section as built: 35 tokens/s of the fine-tuned model
    assert outputs.cost.chats["measured"].tokens_per_second == 35.0
    printed = evaluation_summary_text(cfg, result, cfg, report)  # what ftstack run prints, from the same price
    assert next(l for l in printed.splitlines() if l.strip().startswith("measured")).split()[1] == "35"

    plan = plan_json(dev_bucket)
    planned, program = plan["cost"]["training_run"], plan["outputs"]
    assert planned["throughput_kind"] == program["training_run_throughput_kind"] == "measured"
    assert planned["throughput_source"] == program["training_run_throughput_source"] == ran.throughput_source
    assert round(planned["usd"], 4) == program["training_run_usd"] == ran.usd
    assert planned["tokens_per_second_per_gpu"] == pytest.approx(STEP_TPS)


PIECES = {"monthly_cost", "chat_scenarios", "chat_scenario", "training_run", "nodes_hourly_usd", "node_price",
          "estimate_throughput", "training_estimate", "training_throughput", "plan_run", "stack_plan"}
"""the cost model's pieces (infra/cost/tco.py), the planner's (the throughput, the training nodes' hour, the plan)
and price_stack's own helpers."""


def callers(root: Path) -> dict[str, set[str]]:
    """Piece -> `module:function` of every call in the project's code (tests aside)."""
    import ast

    found: dict[str, set[str]] = {}
    for path in [p for top in ("infra", "planning", "policies", "workloads", "bench") for p in (root / top).rglob("*.py")]:
        module = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), module)
        for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for call in [n for n in ast.walk(func) if isinstance(n, ast.Call)]:
                name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
                if name in PIECES:
                    found.setdefault(name, set()).add(f"{module}:{func.name}")
    return found


def test_price_stack_is_the_only_caller_of_the_cost_models_pieces() -> None:
    """Outside the model's own arithmetic, every piece is called from price_stack or the helpers only it calls; the
    training run is priced from the run's plan, which one planner makes (planning/planner.py) for every consumer."""
    found = callers(REPO)
    assert found["monthly_cost"] == found["chat_scenarios"] == {"infra/cost/price.py:price_stack"}
    assert found["training_estimate"] == {"infra/cost/price.py:price_stack"}
    assert found["training_run"] == {"infra/cost/price.py:training_estimate"}
    assert found["nodes_hourly_usd"] == {"planning/planner.py:train_cost", "planning/planner.py:stage_costs"}
    # the planner reads the throughput the stack is priced with once, for the train job's nodes and for its hours
    assert found["training_throughput"] == {"planning/planner.py:plan_run"}
    assert found["estimate_throughput"] == {"planning/throughput.py:training_throughput"}
    assert found["plan_run"] == {"infra/plans.py:stack_plan", "workloads/train/run_plan.py:job_made_plan"}
    assert found["stack_plan"] <= {"infra/cost/price.py:measured_plan", "infra/cost/price.py:price_stack",
                                   "infra/pipeline/chain.py:pipeline_jobs"}, found["stack_plan"]


@pytest.mark.parametrize("stack", ["demo", "dev"])
def test_plan_prints_an_estimated_training_cost_with_its_basis(stack: str) -> None:
    """L40S stacks without a run of their own (issue 34's review before the first run): the training run is
    priced at the H100 bench row scaled by 362.05/989.4 dense bf16 TFLOP/s, and the table says so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FTSTACK_"))}
    done = subprocess.run([sys.executable, "-m", "infra.commands.cli", "plan", "--stack", stack], cwd=REPO,
                          env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    line = next(l for l in done.stdout.splitlines() if l.startswith("Training run"))
    h100 = next(f for f in bench_throughputs()
                if (f.gpu_model, f.model, f.method) == ("NVIDIA H100 SXM", "hub:Qwen/Qwen3-14B", "qlora"))
    expected = h100.tokens_per_second_per_device * 362.05 / 989.4  # L40S over H100 SXM, dense bf16 TFLOP/s
    assert line.startswith("Training run (estimated): ") and "$" in line and f"{expected:,.0f} tokens/s/GPU" in line
    assert "throughput: estimated from NVIDIA H100 SXM 2026-11-23, scaled by 0.366 (compute-bound" in done.stdout
