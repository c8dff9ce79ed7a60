"""run_manifest.json: what a training run was made from (config, data, base model, code, packages) and when.

`RunManifest` is the one definition of the document; the train job writes it and the operator's side reads
it with `read_run_manifest`. New facts are new optional fields.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from documents.atomic import sha256_file, utc_now, write_text_atomic
from documents.base import DocumentError, parse
from documents.run_plan import RunPlan
from documents.stage_manifest import MANIFEST_NAME, load_model_manifest
from documents.train_plan import AttentionChoice, BatchingDecision, BatchPlan, ParallelismPlan

MANIFEST_VERSION = 1
RUN_MANIFEST_NAME = "run_manifest.json"
"""the file's name in the run's train_run_dir."""
RunStatus = Literal["running", "interrupted", "completed"]


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class DatasetDigest(_Document):
    path: str
    sha256: str
    """sha256 over the per-file sha256 of the dataset's arrow files."""
    prepare_manifest_sha256: str | None = None


class ModelDigest(_Document):
    path: str
    sha256: str
    """sha256 over the per-file sha256 of the weights."""
    digest_from: Literal["prepare manifest", "computed"] = Field(alias="from")
    source: str | None = None
    """the prepare stage's model source (e.g. `gguf:...`, `hub:...`), when it left a manifest."""


class Attempt(_Document):
    """One (re)start of the run, e.g. after a requeue."""

    started: str
    resumed_from_step: int
    slurm_job_id: str | None = None
    slurm_restart_count: int = 0
    ended: str | None = None
    status: RunStatus | None = None
    global_step: int | None = None


class RunManifest(_Document):
    version: Literal[1] = MANIFEST_VERSION
    run: str
    config_sha256: str
    config: dict[str, Any]
    precision: str
    dataset: DatasetDigest
    base_model: ModelDigest
    packages: dict[str, str | None]
    git_commit: str | None = None
    world_size: int
    nodes: int
    started: str | None = None
    """first start of this config (kept across attempts)."""
    ended: str | None = None
    """set when the run completed."""
    status: RunStatus
    attempts: list[Attempt] = []
    global_step: int | None = None
    adapter: str | None = None
    """the saved adapter folder, once completed (methods qlora and lora)."""
    model: str | None = None
    """the saved model folder, once completed (method full)."""
    attention: AttentionChoice | None = None
    """attention implementation and kernel the run trained with (workloads/train/attention.py)."""
    batch_plan: BatchPlan | None = None
    """micro-batch tokens, accumulation and checkpointing the run trained with (planning/batches.py)."""
    fused_loss: bool = False
    device: str | None = None
    """what rank 0 trained on, as torch names it ('NVIDIA H100 80GB HBM3'), or 'cpu'."""
    device_kind: Literal["gpu", "cpu"] | None = None
    batching: BatchingDecision | None = None
    """packed or grouped micro-batches, and under `auto` the figures the choice was made from
    (workloads/train/batch_choice.py); absent in manifests written before it was recorded."""
    parameter_bytes: dict[str, int] | None = None
    """bytes of the frozen and trainable parameters rank 0 held when training started, measured from its tensors
    (under FSDP the local shards)."""
    export_peak_bytes: int | None = None
    """under FSDP: the most bytes of gathered weights rank 0 held at once while writing the adapter (its trainable
    weights only) or a full fine-tune's model (one file's worth plus a tensor); None without FSDP."""
    parallelism: ParallelismPlan | None = None
    """ddp, fsdp or hsdp (shards per replica, replicas), why, and the per-rank memory estimate by part
    (planning/parallelism.py); absent in manifests written before it was recorded."""
    plan: RunPlan | None = None
    """the run plan the run was submitted with (the chain's, without its estimate: infra/pipeline/chain.py
    `job_plan`), or the one the job made when submitted by hand (origin `job`); absent before it was recorded."""
    plan_differences: list[str] = []
    """where the job adapted the plan to the hardware it got, with both figures (planning/job_check.py)."""

    def json_text(self) -> str:
        return self.model_dump_json(indent=2, by_alias=True) + "\n"


PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "datasets", "safetensors")


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


RESUMABLE_CHANGES = {"epochs", "max_steps", "save_steps", "save_total_limit", "eval_steps", "logging_steps",
                     "dataloader_workers", "procs_per_node", "network"}


def training_fingerprint(config: dict[str, Any]) -> str:
    """Hash of what a checkpoint's weights and optimizer state depend on: model, data and the train section
    without run-length, interval and launch fields (so a run can be extended or relaunched and still resume)."""
    train = {k: v for k, v in (config.get("train") or {}).items() if k not in RESUMABLE_CHANGES}
    return config_hash({"model": config.get("model"), "data": config.get("data"), "train": train})


def _combine(entries: dict[str, str]) -> str:
    return hashlib.sha256("".join(f"{k}:{v}\n" for k, v in sorted(entries.items())).encode()).hexdigest()


def dataset_hash(folder: Path) -> dict[str, Any]:
    """sha256 over the dataset's arrow files (and the prepare manifest's hash when there is one)."""
    files = {p.name: sha256_file(p) for p in sorted(folder.glob("*.arrow"))}
    prepared = folder / MANIFEST_NAME
    return {
        "path": str(folder),
        "sha256": _combine(files),
        "prepare_manifest_sha256": sha256_file(prepared) if prepared.is_file() else None,
    }


def model_hash(folder: Path) -> dict[str, Any]:
    """Weights hash from the prepare manifest's per-file sha256 when present, else computed from the files."""
    prepared = load_model_manifest(folder / MANIFEST_NAME)
    weights = {name: info.sha256 for name, info in prepared.weights.items()} if prepared is not None else {}
    source = "prepare manifest"
    if not weights:
        weights = {p.name: sha256_file(p) for p in sorted(folder.glob("*.safetensors"))}
        source = "computed"
    return {"path": str(folder), "sha256": _combine(weights), "from": source,
            "source": prepared.source if prepared is not None else None}


def git_commit(code_dir: Path) -> str | None:
    """FT_GIT_COMMIT when set, else the commit of the code folder if it is itself a git checkout (a bundle is not)."""
    if os.environ.get("FT_GIT_COMMIT"):
        return os.environ["FT_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(code_dir), "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if len(lines) != 2 or Path(lines[0]).resolve() != code_dir.resolve():
        return None
    return lines[1]


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def read_run_manifest(text: str | bytes, origin: str) -> RunManifest:
    return parse(RunManifest, text, origin, "run manifest")


def load_run_manifest(path: Path) -> RunManifest | None:
    """The run's manifest on this machine so far, None when absent or unreadable (a fresh start; for resume)."""
    try:
        return read_run_manifest(path.read_bytes(), str(path))
    except (OSError, DocumentError):
        return None


def start_attempt(path: Path, base: dict[str, Any], resumed_from: int) -> RunManifest:
    """Manifest for a run (re)starting now: the first start is kept, each (re)start is one attempt."""
    previous = load_run_manifest(path)
    same = previous is not None and previous.config_sha256 == base["config_sha256"]
    attempts = list(previous.attempts) if same else []
    attempts.append(Attempt(
        started=utc_now(),
        resumed_from_step=resumed_from,
        slurm_job_id=os.environ.get("SLURM_JOB_ID"),
        slurm_restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
    ))
    manifest = RunManifest.model_validate({
        **base, "started": previous.started if same else utc_now(), "ended": None, "status": "running",
        "attempts": attempts,
    })
    write_text_atomic(path, manifest.json_text())
    return manifest


def finish_attempt(path: Path, manifest: RunManifest, status: RunStatus, step: int,
                   adapter: str | None = None, model: str | None = None,
                   export_peak_bytes: int | None = None) -> RunManifest:
    now = utc_now()
    last = manifest.attempts[-1].model_copy(update={"ended": now, "status": status, "global_step": step})
    manifest = manifest.model_copy(update={
        "status": status, "global_step": step, "attempts": [*manifest.attempts[:-1], last],
        **({"adapter": adapter} if adapter is not None else {}),
        **({"model": model} if model is not None else {}),
        **({"export_peak_bytes": export_peak_bytes} if export_peak_bytes is not None else {}),
        **({"ended": now} if status == "completed" else {}),
    })
    write_text_atomic(path, manifest.json_text())
    return manifest
