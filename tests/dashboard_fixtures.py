"""Sample stack outputs and a stored run for dashboard tests, built from the real cost model and artifact store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from document_fixtures import evaluator_report, side

from documents.metrics import MetricsRecord
from infra.config import load_stack_config
from infra.program.mocks import run_under_mocks
from infra.runs.store import RunStore, upload_run

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SAMPLE = {"input": "Question:\nWhat does a <b>bond</b> coupon mean?", "reference": "The periodic interest payment.",
          "generated": "It is the interest."}
"""markup in a sample must show as text on the page, never as markup."""
EVALUATOR = evaluator_report(
    "104", side(7.033111572265625, 41.5, message_length_avg=671.0),
    side(4.704128742218018, 38.2, message_length_avg=125.1, sample_generations=[SAMPLE]), run="local")


def stack_outputs(stack: str) -> dict[str, Any]:
    """The stack's outputs from the program's run under mocks."""
    return dict(run_under_mocks(load_stack_config(stack, REPO / "stacks")).outputs)


def store_run(store: RunStore, stack: str, work: Path, run_id: str = "20260301-120000") -> dict[str, Any]:
    """A finished run as the pipeline leaves it (config, manifest, metrics, evaluator JSON), uploaded."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "local.json"
    config.write_text((REPO / "workloads" / "configs" / "local.json").read_text())
    train = work / "outputs" / "local"
    train.mkdir(parents=True)
    metrics = [MetricsRecord(step=s, epoch=s / 20, loss=round(2.9 * 0.9**s, 4), tokens_per_second=512.0) for s in range(1, 21)]
    metrics.append(MetricsRecord(step=20, epoch=1.0, eval_loss=1.234))
    (train / "metrics.jsonl").write_text("".join(m.line() for m in metrics))
    (train / "run_manifest.json").write_text(json.dumps({"run": "local", "status": "completed"}))
    results = work / "results"
    results.mkdir()
    (results / "evaluator_104.json").write_text(EVALUATOR.model_dump_json())
    upload_run(store, stack, run_id, config, train, results,
               job_ids={"prepare": "101", "readiness": "102", "train": "103", "eval": "104"},
               job_states={"prepare": "COMPLETED", "readiness": "COMPLETED", "train": "COMPLETED", "eval": "COMPLETED"},
               job_durations_s={"prepare": 42.0, "readiness": 3.0, "train": 3725.0, "eval": 95.0},
               cost_usd=0.0, started_at="2026-03-01T12:00:00+00:00")
    return {"metrics": metrics, "final_loss": metrics[-2].loss}
