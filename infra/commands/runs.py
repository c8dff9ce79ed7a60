"""`ftstack runs --stack NAME`: past pipeline runs of a stack with their key figures, from the run store;
`--adapters`: the runs' LoRA adapters as `serve --adapter NAME=RUN_ID` takes them (base hash, rank, data hash,
evaluation). A run whose stored files cannot be read is listed as damaged, with the file and why, after the others
(on standard error with --json)."""

from __future__ import annotations

import argparse
import json
import sys

from botocore.exceptions import BotoCoreError, ClientError

from documents.adapter_registry import AdapterEntry
from documents.base import DocumentError
from documents.metrics import METRICS_NAME, read_metrics
from documents.run_manifest import read_run_manifest
from documents.run_record import RunIndex
from documents.run_store import ADAPTER_DIR, INDEX_NAME, MANIFEST_KEY, stack_key
from documents.throughput import measure_run
from infra.config import StackConfigError, load_stack_config
from infra.config import find_repo_root
from infra.runs.store import (
    ArtifactError,
    RunStore,
    DamagedRun,
    read_run_file,
    run_prefix,
    scan_runs,
    store_for_stack,
)
from workloads.serve.registry import RegistryError, adapter_entry

COLUMNS = ("run", "started", "finished", "ppl base", "ppl tuned", "ppl gain %", "tokens/s/device",
           "train measured/priced", "cost $", "jobs")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "runs",
        help="list past pipeline runs of a stack (perplexity base/fine-tuned, tokens/s, cost)",
        description=f"Reads {stack_key('<stack>')}*/{INDEX_NAME} from the stack's run store (.local/artifacts for "
        "the local stack, the artifacts bucket for cloud stacks).",
    )
    parser.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<stack>.yaml)")
    parser.add_argument("--config-dir", default="stacks", help="directory of the stack files (default: stacks)")
    parser.add_argument("--bucket", help="artifacts bucket of a cloud stack (default: $FTSTACK_ARTIFACTS_BUCKET)")
    parser.add_argument("--json", action="store_true", help="print the run indexes as a JSON list")
    parser.add_argument("--adapters", action="store_true",
                        help="list the runs' adapters (name = run id) with base hash, rank, data hash, evaluation")
    parser.set_defaults(func=run)


ADAPTER_COLUMNS = ("adapter (run id)", "base sha256", "rank", "data sha256", "ppl tuned", "ppl gain %", "folder")


def adapter_entries(store: RunStore, stack_name: str, runs: list[RunIndex]
                    ) -> tuple[list[AdapterEntry], list[DamagedRun]]:
    """The adapter of every run whose stored manifest names one, named after its run id; and the runs whose stored
    manifest cannot be read (listed as damaged, the others stay usable)."""
    entries, damaged = [], []
    for index in runs:
        if MANIFEST_KEY not in index.files:
            continue
        key = f"{run_prefix(stack_name, index.run_id)}/{MANIFEST_KEY}"
        try:
            manifest = read_run_manifest(read_run_file(store, stack_name, index.run_id, MANIFEST_KEY),
                                         store.describe(key))
            entry = adapter_entry(index.run_id, index.run_id, manifest, index)
            entries.append(entry.model_copy(update={"adapter_dir": stored_folder(store, stack_name, index)}))
        except RegistryError:
            continue
        except (ArtifactError, DocumentError) as exc:
            damaged.append(DamagedRun(index.run_id, store.describe(key), str(exc)))
    return entries, damaged


def stored_folder(store: RunStore, stack_name: str, index: RunIndex) -> str:
    """Where a server loads the run's adapter from: the store's copy (documents.run_store.adapter_folder), not the
    training output folder its manifest names; a run stored before adapters were kept with it says so."""
    if index.adapter_sha256 is None:
        return "(not stored: upload the run again)"
    return store.describe(f"{run_prefix(stack_name, index.run_id)}/{ADAPTER_DIR}")


def format_damaged(damaged: list[DamagedRun]) -> str:
    """One line per damaged run: its id and why, the reason naming the stored file."""
    return "\n".join([f"{len(damaged)} damaged run(s), not listed above:",
                      *(f"  {d.run_id}: {d.reason}" for d in damaged)])


def format_adapters(entries: list[AdapterEntry]) -> str:
    rows = [ADAPTER_COLUMNS, *[(e.name, e.base_model_sha256[:12], str(e.rank or "-"), (e.dataset_sha256 or "-")[:12],
                               _fmt(e.evaluation.perplexity_finetuned if e.evaluation else None, 3),
                               _fmt(e.evaluation.perplexity_improvement_pct if e.evaluation else None, 1),
                               e.adapter_dir) for e in entries]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(ADAPTER_COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


STORED_METRICS = f"train/{METRICS_NAME}"


def own_speeds(store: RunStore, stack_name: str, runs: list[RunIndex]) -> dict[str, float | None]:
    """Tokens/s per device over the steps each run's own train job logged, from its stored records and manifest
    (the run record's figure covers every record in the training folder, earlier jobs' too): a run that reused an
    earlier run's train job shows that job's figure, one whose train job logged no step none (None). Runs without
    readable stored records are left out (the table shows their record's figure)."""
    speeds: dict[str, float | None] = {}
    for index in runs:
        job = index.job_ids.get("train")
        if job is None or not {STORED_METRICS, MANIFEST_KEY} <= set(index.files):
            continue
        try:
            records = read_metrics(read_run_file(store, stack_name, index.run_id, STORED_METRICS), STORED_METRICS)
            manifest = read_run_manifest(read_run_file(store, stack_name, index.run_id, MANIFEST_KEY), MANIFEST_KEY)
            measured = measure_run([r for r in records if r.job_id in (None, job)], manifest, gpu_model=None,
                                   stack_name=stack_name, run_id=index.run_id, source="ftstack runs")
        except (ArtifactError, DocumentError):
            continue
        speeds[index.run_id] = measured.tokens_per_second_per_device if measured else None
    return speeds


def table_rows(runs: list[RunIndex], speeds: dict[str, float | None] | None = None) -> list[tuple[str, ...]]:
    """One row per run; tokens/s per device: the run's own from `speeds` (`own_speeds`), else its record's."""
    return [
        (
            r.run_id,
            r.started_at or "-",
            r.finished_at or "-",
            _fmt(r.perplexity_base, 3),
            _fmt(r.perplexity_finetuned, 3),
            _fmt(r.perplexity_improvement_pct, 1),
            _fmt(speeds[r.run_id] if speeds and r.run_id in speeds else
                 r.throughput.tokens_per_second_per_device if r.throughput else None, 1),
            _fmt(r.throughput_check.ratio if r.throughput_check else None, 2),
            _fmt(r.cost_usd, 2),
            " ".join(f"{stage}={job}" for stage, job in r.job_ids.items()) or "-",
        )
        for r in runs
    ]


def format_table(runs: list[RunIndex], speeds: dict[str, float | None] | None = None) -> str:
    rows = [COLUMNS, *table_rows(runs, speeds)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def run(args: argparse.Namespace) -> int:
    try:
        stack = load_stack_config(args.stack, args.config_dir)
        store = store_for_stack(stack, find_repo_root(), bucket=args.bucket)
        listing = scan_runs(store, args.stack)
        runs, damaged = listing.runs, listing.damaged
        entries, unreadable = adapter_entries(store, args.stack, runs) if args.adapters else ([], [])
    except (StackConfigError, ArtifactError, BotoCoreError, ClientError) as exc:
        print(f"ftstack runs: {exc}", file=sys.stderr)
        return 2
    damaged = damaged + unreadable
    if args.adapters:
        print(json.dumps([e.model_dump() for e in entries], indent=2) if args.json else
              format_adapters(entries) if entries else f"no run of stack {args.stack!r} has an adapter")
    elif args.json:
        print(json.dumps([r.model_dump() for r in runs], indent=2))
    elif not runs:
        where = store.describe(stack_key(args.stack))
        print(f"no {'readable ' if damaged else ''}runs of stack {args.stack!r} in {where}")
    else:
        print(format_table(runs, own_speeds(store, args.stack, runs)))
    if damaged:
        print(format_damaged(damaged), file=sys.stderr if args.json else sys.stdout)
    return 0
