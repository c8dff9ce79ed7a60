"""`ftstack report --stack NAME [--outputs FILE] --out DIR`: a static HTML dashboard of a stack."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from documents.base import DocumentError
from documents.evaluator_report import read_evaluator_report
from documents.metrics import METRICS_NAME, read_metrics
from documents.run_store import stack_key
from documents.stack_outputs import StackOutputs, parse_stack_outputs, read_stack_outputs
from infra.config import StackConfig, StackConfigError, load_stack_config
from infra.dashboard import build, write_dashboard
from infra.dashboard.model import StoredRun
from infra.monitoring.view import job_metrics_view
from infra.program.mocks import run_under_mocks
from infra.config import find_repo_root
from infra.runs.store import ArtifactError, RunStore, DamagedRun, run_prefix, scan_runs, store_for_stack


class RunNotFoundError(ArtifactError):
    """`--run RUN_ID` names a run the store does not have."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="render a static HTML dashboard (cost, node sets, jobs, loss curve, comparison) from stack outputs",
        description="Reads stack outputs (`pulumi stack output --json`, `ftstack plan --json` or `ftstack run` "
        "output) or, without --outputs, the stack's mock run; adds the latest run from the run store. "
        "Writes DIR/index.html (self-contained, works offline).",
    )
    parser.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<stack>.yaml)")
    parser.add_argument("--outputs", help="stack outputs JSON file (`pulumi stack output --json`), or - for "
                        "standard input")
    parser.add_argument("--out", type=Path, required=True, help="output directory for index.html")
    parser.add_argument("--run", help="run id to show (default: the latest run in the run store)")
    parser.add_argument("--config-dir", default="stacks", help="directory of the stack files (default: stacks)")
    parser.add_argument("--bucket", help="artifacts bucket of a cloud stack (default: stack output or env)")
    parser.set_defaults(func=run)


def read_outputs(path: str) -> StackOutputs:
    """Stack outputs from a file, or standard input for `-` (`pulumi stack output --json | ftstack report ...`)."""
    if path == "-":
        return read_stack_outputs(sys.stdin.buffer.read(), "standard input")
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise DocumentError(f"{path}: cannot read stack outputs: {exc}") from exc
    return read_stack_outputs(text, path)


def mock_outputs(stack: StackConfig) -> StackOutputs:
    """The outputs the Pulumi program exports for this stack, from its run under mocks."""
    return parse_stack_outputs(run_under_mocks(stack).outputs, f"the mock run of stack {stack.stack}")


def damaged_warning(damaged: list[DamagedRun]) -> str:
    """One line for the page and standard error: each damaged run's stored file and why."""
    return f"{len(damaged)} stored run(s) damaged, not shown: " + "; ".join(d.reason for d in damaged)


def latest_run(store: RunStore, stack_name: str, run_id: str | None) -> tuple[StoredRun | None, list[DamagedRun]]:
    """Index, metrics and evaluator report of one stored run (the latest readable one unless `run_id`), and the runs
    whose index is damaged."""
    listing = scan_runs(store, stack_name)
    runs = listing.runs
    if run_id is not None:
        if hit := next((d for d in listing.damaged if d.run_id == run_id), None):
            raise RunNotFoundError(f"run {run_id!r} of stack {stack_name!r} is damaged: {hit.reason}")
        runs = [r for r in runs if r.run_id == run_id]
        if not runs:
            raise RunNotFoundError(f"run {run_id!r} of stack {stack_name!r} not found in "
                                   f"{store.describe(stack_key(stack_name))}")
    if not runs:
        return None, listing.damaged
    index = runs[-1]
    prefix = run_prefix(stack_name, index.run_id)
    metrics_key = f"{prefix}/train/{METRICS_NAME}"
    report_name = next((f for f in index.files if f.startswith("eval/") and f.endswith(".json")), None)
    report_key = f"{prefix}/{report_name}"
    try:
        metrics = read_metrics(store.get_bytes(metrics_key), store.describe(metrics_key)) \
            if f"train/{METRICS_NAME}" in index.files else []
        evaluator = read_evaluator_report(store.get_bytes(report_key), store.describe(report_key)) \
            if report_name else None
    except DocumentError as exc:
        raise ArtifactError(str(exc)) from None
    return StoredRun(index=index, metrics=metrics, evaluator=evaluator), listing.damaged


def stored_run(stack: StackConfig, root: Path, bucket: Any, run_id: str | None) -> tuple[StoredRun | None, list[str]]:
    """The run to show and, when the run store cannot be read or holds damaged runs, why (the page still
    renders)."""
    if stack.target == "nebius" and not isinstance(bucket, str):
        return None, []
    try:
        store = store_for_stack(stack, root, bucket=bucket)
        run, damaged = latest_run(store, stack.stack, run_id)
    except RunNotFoundError:
        raise
    except (ArtifactError, BotoCoreError, ClientError) as exc:
        return None, [f"runs not read from the artifacts store: {exc}"]
    return run, [damaged_warning(damaged)] if damaged else []


def run(args: argparse.Namespace) -> int:
    root = find_repo_root()
    try:
        stack = load_stack_config(args.stack, args.config_dir)
        if args.outputs is not None:
            outputs = read_outputs(args.outputs)
            source = "standard input" if args.outputs == "-" else args.outputs
        else:
            outputs, source = mock_outputs(stack), f"the mock run of stacks/Pulumi.{args.stack}.yaml"
        bucket = outputs.platform.buckets.get("artifacts") if outputs.platform is not None else None
        run_data, warnings = stored_run(stack, root, args.bucket or bucket, args.run)
        data = build(args.stack, outputs, stack, run_data)
        data.job_metrics = job_metrics_view(stack.target, root, run_data.index if run_data else None)
        for warning in warnings:
            print(f"ftstack report: warning: {warning}", file=sys.stderr)
            data.warnings.append(warning)
        page = write_dashboard(data, args.out, source)
    except (StackConfigError, ArtifactError, ValueError, BotoCoreError, ClientError) as exc:  # DocumentError too
        print(f"ftstack report: {exc}", file=sys.stderr)
        return 2
    print(page.resolve())
    return 0
