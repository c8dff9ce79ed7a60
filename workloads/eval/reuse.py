"""Whether an evaluation already done still holds: the digest of what the figures were measured on, and the newest
report in the results folder carrying the same digest.

The digest covers the whole run config (model source, data, training and eval sections), the fine-tuned kind, the
device and dtype, and every file of the base model, the fine-tuned model and the test split by name, size and
modification time: retraining, re-preparing or editing any of them measures again; an unchanged rerun (a second
`make demo`, the eval page's commands after it) reuses the report, as prepare and train skip their done steps.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from documents.base import DocumentError
from documents.evaluator_report import EvaluatorReport, read_evaluator_report
from documents.run_config import RunConfig


def file_stats(folder: Path) -> list[tuple[str, int, int]]:
    """(path under the folder, size, mtime in ns) of each regular file, sorted; one entry for a single file."""
    files = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.is_file())
    stats = [(p, p.stat()) for p in files]
    return [(str(p.relative_to(folder)) if p != folder else p.name, st.st_size, st.st_mtime_ns) for p, st in stats]


def inputs_sha256(run: RunConfig, kind: str, device: str, dtype: str) -> str:
    """The digest of everything the evaluator's figures depend on (see the module's docstring)."""
    finetuned = run.merged_dir if kind == "merged" else run.adapter_dir
    inputs = {
        "config": run.model_dump(mode="json"),
        "finetuned_kind": kind,
        "device": device,
        "dtype": dtype,
        "files": {side: file_stats(folder) for side, folder in (
            ("base", run.base_model_dir), ("finetuned", finetuned), ("test", run.test_tokenized_dir),
            ("test_jsonl", run.test_jsonl)) if folder.exists()},
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def current_report(results_dir: Path, digest: str) -> EvaluatorReport | None:
    """The newest readable report in the folder measured on inputs with this digest, if any."""
    reports = sorted(results_dir.glob("evaluator_*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for path in reports:
        try:
            report = read_evaluator_report(path.read_bytes(), str(path))
        except (OSError, DocumentError):
            continue
        if report.inputs_sha256 == digest:
            return report
    return None
