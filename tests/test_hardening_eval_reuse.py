"""Issue 64 item 4: the evaluator's reuse digest is of content, not of names, sizes and times.

Probes on a prepared tiny run with an exported (merged) fine-tune beside it:
  - a test row changed with its size kept, then `touch -r` back to the old time: another digest (it was the same);
  - `serve.port` changed: the same digest (it was another: the whole config was hashed);
  - the merged weights touched (time only): the same digest; re-exported from another adapter (its manifest records
    another hash): another digest; another eval section: another digest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import tiny_run_config
from documents.atomic import utc_now
from documents.run_config import RunConfig, parse_run_config
from documents.stage_manifest import MANIFEST_NAME, MergedManifest, write_manifest
from workloads.eval.reuse import inputs_sha256


@pytest.fixture
def evaluable(tiny_model_dir: Path, tmp_path: Path) -> RunConfig:
    """A prepared tiny run of its own (its files are edited here) and a merged folder with its export manifest."""
    from workloads.prepare import run as prepare

    run = tiny_run_config(tmp_path / "run", tiny_model_dir, rows=16)
    prepare(run)
    shutil.copytree(run.base_model_dir, run.merged_dir)
    (run.merged_dir / MANIFEST_NAME).unlink()
    _export_manifest(run, "a" * 64)
    return run


def _export_manifest(run: RunConfig, adapter_sha256: str) -> None:
    write_manifest(run.merged_dir / MANIFEST_NAME, MergedManifest(
        adapter={"path": str(run.adapter_dir), "sha256": adapter_sha256}, base=str(run.base_model_dir),
        dtype="float32", created=utc_now()))


def _digest(run: RunConfig) -> str:
    return inputs_sha256(run, "merged", "cpu", "float32")


def test_a_test_row_changed_with_size_and_time_kept_is_measured_again(evaluable: RunConfig) -> None:
    before = _digest(evaluable)
    split = evaluable.test_jsonl
    text = split.read_text(encoding="utf-8")
    at = next(i for i in range(text.index('"content"') + 12, len(text)) if text[i] in "ab")
    edited = text[:at] + {"a": "b", "b": "a"}[text[at]] + text[at + 1:]
    saved = split.with_name("saved-time")
    shutil.copy2(split, saved)
    split.write_text(edited, encoding="utf-8")
    subprocess.run(["touch", "-r", str(saved), str(split)], check=True)
    assert split.stat().st_size == saved.stat().st_size and split.stat().st_mtime_ns == saved.stat().st_mtime_ns
    assert _digest(evaluable) != before


def test_a_change_the_evaluator_does_not_read_reuses_and_a_model_change_does_not(evaluable: RunConfig) -> None:
    before = _digest(evaluable)
    port = evaluable.serve.port if evaluable.serve else 8000
    moved = parse_run_config({**evaluable.model_dump(mode="json"), "serve": {"port": port + 1}}, "moved")
    assert moved.serve is not None and moved.serve.port == port + 1
    assert _digest(moved) == before

    weights = next(evaluable.merged_dir.glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert _digest(evaluable) == before

    _export_manifest(evaluable, "b" * 64)
    assert _digest(evaluable) != before
    _export_manifest(evaluable, "a" * 64)
    assert _digest(evaluable) == before

    other_eval = parse_run_config({**evaluable.model_dump(mode="json"), "eval": {"num_prompts": 7}}, "other_eval")
    assert _digest(other_eval) != before
