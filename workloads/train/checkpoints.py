"""Checkpoints that are complete or ignored: staged in a temporary folder, sealed with a marker listing every
file and its size, renamed into place; resume picks the newest one that still matches its marker."""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from documents.atomic import replace_dir, utc_now
from documents.base import DocumentError
from documents.checkpoint_marker import MARKER_NAME as MARKER
from documents.checkpoint_marker import CheckpointMarker, read_checkpoint_marker, write_checkpoint_marker

log = logging.getLogger("workloads.train.checkpoints")

PREFIX = "checkpoint-"
STAGING = ".staging-"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


def checkpoint_step(path: Path) -> int | None:
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


def _checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def seal(folder: Path, step: int, fingerprint: str | None = None) -> None:
    """Write the completion marker: every file of `folder` with its size, and the training fingerprint."""
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    write_checkpoint_marker(folder, CheckpointMarker(step=step, fingerprint=fingerprint, files=files, sealed=utc_now()))


def problem(folder: Path, fingerprint: str | None = None) -> str | None:
    """Why `folder` is not a usable checkpoint (for `fingerprint`, when given), or None when it is."""
    if not (folder / MARKER).exists():
        return "no completion marker (interrupted while saving)"
    try:
        marker = read_checkpoint_marker(folder)
    except DocumentError as error:
        return f"unreadable completion marker: {error}"
    if marker.step != checkpoint_step(folder):
        return f"marker step {marker.step} does not match the folder name"
    if fingerprint is not None and marker.fingerprint != fingerprint:
        return "written by a different training configuration"
    for name, size in marker.files.items():
        path = folder / name
        if not path.is_file():
            return f"missing {name}"
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size} bytes, expected {size} (truncated or overwritten)"
    for weights in folder.glob("*.safetensors"):
        try:
            from safetensors import safe_open

            with safe_open(str(weights), framework="pt") as handle:
                handle.keys()
        except Exception as error:  # noqa: BLE001 - any decoding failure means a corrupt file
            return f"{weights.name} cannot be read: {error}"
    return None


FSDP_MODEL = "pytorch_model_fsdp_0"
"""the folder of a checkpoint's sharded weights (torch.distributed.checkpoint), written under FSDP or HSDP only."""


def written_by(folder: Path) -> tuple[str, int]:
    """(ddp or fsdp, ranks) of the run that wrote the checkpoint: sharded weights mean FSDP; one RNG state per
    rank."""
    ranks = len(list(folder.glob("rng_state_*.pth"))) or 1
    return ("fsdp" if (folder / FSDP_MODEL).is_dir() else "ddp"), ranks


class CannotResume(ValueError):
    """A checkpoint this run cannot load; the message says what to change."""


def check_resumable(folder: Path, strategy: str, world_size: int) -> str | None:
    """Refuse a checkpoint of the other strategy (FSDP and HSDP write the same sharded kind: each loads the other's,
    resharded); a different rank count loads (torch.distributed.checkpoint reshards FSDP states, DDP's are whole),
    returned as a note for the log."""
    saved, ranks = written_by(folder)
    if saved != {"hsdp": "fsdp"}.get(strategy, strategy):
        raise CannotResume(
            f"{folder} was written under {saved} and this run trains under {strategy}: set train.parallelism: {saved} "
            f"to resume it (an fsdp checkpoint needs 2 or more ranks), or move {folder.parent} away to start again")
    if ranks != world_size:
        return (f"{folder} was written by {ranks} ranks, resuming on {world_size}: the weights and optimizer states "
                f"load as they are ({'resharded' if saved == 'fsdp' else 'whole'}), but the global batch changes with "
                "the ranks and the rows after the resume point are split among the ranks anew")
    return None


def latest_complete(root: Path, fingerprint: str | None = None) -> Path | None:
    """Newest intact checkpoint under `root` (of this `fingerprint`); others are skipped with a warning."""
    for folder in reversed(_checkpoints(root)):
        reason = problem(folder, fingerprint)
        if reason is None:
            return folder
        log.warning("skipping checkpoint %s: %s", folder, reason)
    return None


SAVE_FAILED_EXIT = 74
"""sysexits' EX_IOERR: a checkpoint could not be written. Not 75 (EX_TEMPFAIL, stopped with a checkpoint, what the
train job requeues on): a requeued job would fail at the same save again."""


class SaveFailed(RuntimeError):
    """A checkpoint could not be written; the message names the folder, its filesystem and the free space."""


def filesystem(path: Path) -> tuple[str, str]:
    """(mount point, type) of the filesystem holding `path`: the longest mount point of /proc/self/mounts above it."""
    real, best = os.path.realpath(path), ("/", "unknown")
    try:
        lines = Path("/proc/self/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        mount = fields[1].replace("\\040", " ") if len(fields) > 2 else ""
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if mount and inside and len(mount) >= len(best[0]):
            best = (mount, fields[2])
    return best


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def save_failure(root: Path, step: int, error: BaseException | None) -> SaveFailed:
    """The one-line error for a save of checkpoint-<step> under `root` that failed with `error` (None: on another
    rank): the folder, its filesystem and the space left there when it failed."""
    mount, kind = filesystem(root)
    try:
        usage = shutil.disk_usage(root)
        space = f"{_size(usage.free)} free of {_size(usage.total)}"
    except OSError as unknown:
        space = f"free space unknown ({unknown.strerror})"
    cause = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}" if error else "an error on another rank"
    return SaveFailed(
        f"cannot write {PREFIX}{step} in {root}: filesystem {mount} ({kind}) has {space}; the save failed with "
        f"{cause}. The staging folder is removed and the previous checkpoint kept: free space there or set "
        "train.checkpoint_dir on a larger filesystem, then rerun")


def publish(staged: Path, root: Path, step: int, fingerprint: str | None = None) -> Path:
    """Seal the staged checkpoint and rename it to <root>/checkpoint-<step>."""
    seal(staged, step, fingerprint)
    target = root / f"{PREFIX}{step}"
    replace_dir(staged, target)
    return target


def prune(root: Path, keep: int, fingerprint: str | None = None) -> None:
    """Keep the newest `keep` intact checkpoints; delete older ones, broken ones below the newest intact one,
    and stale staging folders."""
    for stale in root.glob(f"{STAGING}*"):
        shutil.rmtree(stale, ignore_errors=True)
    folders = _checkpoints(root)
    intact = [f for f in folders if problem(f, fingerprint) is None]
    kept = set(intact[-keep:]) if keep > 0 else set()
    newest = checkpoint_step(intact[-1]) if intact else None
    for folder in folders:
        step = checkpoint_step(folder) or 0
        if folder not in kept and (folder in intact or (newest is not None and step < newest)):
            shutil.rmtree(folder, ignore_errors=True)
