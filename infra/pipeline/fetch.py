"""Bring a finished run's files back from the Slurm machine through its transport (SSH for clusters).

What comes back is what the local stack's store keeps: the training run's manifest, metrics and charts, and
the eval job's evaluator JSON and chart. Files travel base64-encoded over the transport's command channel, so
binary charts arrive intact on any transport.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
from pathlib import Path, PurePosixPath

from infra.pipeline.transport import Transport, TransportError

TRAIN_PATTERNS = ("run_manifest.json", "metrics.jsonl", "*.png", "*.svg")
EVAL_SUFFIXES = (".json", ".png", ".svg")


def list_files(transport: Transport, folder: str) -> list[str]:
    """Names of the regular files directly in `folder` on the Slurm machine (empty when it does not exist)."""
    result = transport.run(["find", folder, "-maxdepth", "1", "-type", "f", "-printf", "%f\\n"], timeout=120)
    if not result.ok:
        return []
    return sorted(line for line in result.stdout.splitlines() if line)


def fetch_file(transport: Transport, path: str, dest: Path) -> None:
    """Copy one remote file to `dest` (written beside it, then renamed into place)."""
    result = transport.run(["base64", "-w0", path], timeout=600).check()
    try:
        data = base64.b64decode(result.stdout.strip(), validate=True)
    except binascii.Error as error:
        raise TransportError(f"{path}: its content did not come back intact ({error})") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(dest)


def fetch_run(transport: Transport, train_dir: str, results_dir: str, eval_job_id: str, dest: Path) -> tuple[Path, Path]:
    """Copy a run's training and evaluation files under `dest` (train/, results/); returns those two folders."""
    train_out, results_out = dest / "train", dest / "results"
    train_out.mkdir(parents=True, exist_ok=True)
    results_out.mkdir(parents=True, exist_ok=True)
    for name in list_files(transport, train_dir):
        if any(fnmatch.fnmatch(name, pattern) for pattern in TRAIN_PATTERNS):
            fetch_file(transport, str(PurePosixPath(train_dir) / name), train_out / name)
    for name in list_files(transport, results_dir):
        if name.startswith(f"evaluator_{eval_job_id}") and name.endswith(EVAL_SUFFIXES):
            fetch_file(transport, str(PurePosixPath(results_dir) / name), results_out / name)
    return train_out, results_out
