"""Whether an evaluation already done still holds: the digest of what the figures were measured on, and the newest
report in the results folder carrying the same digest.

The digest is of content, never of names, sizes or times (a row edited with its size kept and `touch -r` is another
digest): the bytes of the test split (its JSONL and tokenized folder, small) and of the train split's tokenize
manifest (the report's data section); the base and the fine-tuned model by the weight hashes their manifests record
(documents/stage_manifest.py: the base's ModelManifest, the merged model's MergedManifest with its adapter or
trained weights and dtype) plus the bytes of their other files, an adapter or a folder without a readable manifest
by every file's bytes; and only what the evaluator reads of the run config: the run's name and its eval section
(a change of serve.port or of the training section measures nothing again; retraining changes the fine-tuned
model's hash). Plus the fine-tuned kind, the device and the dtype. An unchanged rerun (a second `make demo`, the
eval page's commands after it) reuses the report, as prepare and train skip their done steps.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from documents.atomic import sha256_file
from documents.base import DocumentError
from documents.evaluator_report import EvaluatorReport, read_evaluator_report
from documents.run_config import RunConfig
from documents.sections.eval import EvalConfig
from documents.stage_manifest import MANIFEST_NAME, load_merged_manifest, load_model_manifest

WEIGHTS = "*.safetensors"


def content_sha256(path: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of each regular file's bytes under `path` (keyed by its path there; `path` itself for a file), but
    for files matching a pattern of `skip`."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    kept = [p for p in files if not any(p.match(pattern) for pattern in skip)]
    return {(str(p.relative_to(path)) if p != path else p.name): sha256_file(p) for p in kept}


def model_identity(folder: Path, merged: bool) -> dict[str, Any]:
    """The weights by the hashes the folder's manifest records, every other file by its bytes; every file by its
    bytes when the manifest is missing or unreadable."""
    load = load_merged_manifest if merged else load_model_manifest
    manifest = load(folder / MANIFEST_NAME) if folder.is_dir() else None
    if manifest is None:
        return {"files": content_sha256(folder)} if folder.exists() else {}
    return {"manifest": manifest.model_dump(mode="json", exclude={"created"}),
            "files": content_sha256(folder, skip=(WEIGHTS, MANIFEST_NAME))}


def inputs_sha256(run: RunConfig, kind: str, device: str, dtype: str) -> str:
    """The digest of everything the evaluator's figures depend on (see the module's docstring)."""
    finetuned = (model_identity(run.merged_dir, merged=True) if kind == "merged"
                 else {"files": content_sha256(run.adapter_dir)} if run.adapter_dir.exists() else {})
    train_losses = run.train_tokenized_dir / MANIFEST_NAME
    inputs = {
        "run": run.name,
        "eval": (run.eval or EvalConfig()).model_dump(mode="json", exclude={"chart"}),
        "finetuned_kind": kind,
        "device": device,
        "dtype": dtype,
        "base": model_identity(run.base_model_dir, merged=False),
        "finetuned": finetuned,
        "test": {side: content_sha256(path) for side, path in (
            ("tokenized", run.test_tokenized_dir), ("jsonl", run.test_jsonl)) if path.exists()},
        "train_losses": content_sha256(train_losses) if train_losses.is_file() else {},
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
