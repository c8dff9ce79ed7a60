"""The run store's layout and the order a run's files are written in: the one place either is spelled.

A run store (a folder such as `.local/artifacts` or the cluster's shared one, or the artifacts bucket) keeps each
run under `runs/<stack>/<run_id>/`: its files by kind (`config/`, `train/` with the run manifest, `eval/`,
`adapter/` with the trained adapter) and its index `run.json` (documents.run_record.RunIndex). The index is
written last, once every file it lists is in place, so that a reader who finds it finds the whole run.

Writers: `ftstack run` (infra.runs.store.upload_run, into any store) and the publish stage
(workloads.serve.publish, into the serving folder). Readers: `ftstack runs` and `report`, the program's
measured-throughput lookup and the serving registry (workloads.serve.registry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from documents.names import checked_name
from documents.run_manifest import RUN_MANIFEST_NAME
from documents.run_record import RunIndex, write_run_record

RUNS = "runs"
INDEX_NAME = "run.json"
ADAPTER_DIR = "adapter"
MANIFEST_KEY = f"train/{RUN_MANIFEST_NAME}"
"""the run manifest within a stored run"""


def stack_key(stack_name: str) -> str:
    """The key prefix of every run of `stack_name` (ends with a slash)."""
    return f"{RUNS}/{stack_name}/"


def run_key(stack_name: str, run_id: str) -> str:
    """The key prefix of one run (no trailing slash)."""
    return f"{RUNS}/{stack_name}/{run_id}"


def checked_run_key(stack_name: str, run_id: str) -> str:
    """`run_key` of a stack name and run id that are checked names (ValueError naming the one that is not)."""
    return run_key(checked_name(stack_name, "stack name"), checked_name(run_id, "run id"))


def index_key(stack_name: str, run_id: str) -> str:
    return f"{run_key(stack_name, run_id)}/{INDEX_NAME}"


def is_index_key(key: str) -> bool:
    """Whether `key` is a run's index (`runs/<stack>/<run_id>/run.json`, nothing deeper)."""
    parts = key.split("/")
    return len(parts) == 4 and parts[0] == RUNS and parts[3] == INDEX_NAME


def run_id_of_key(key: str) -> str:
    """The run id of a key inside a run (`runs/<stack>/<run_id>/...`)."""
    return key.split("/")[2]


def runs_folder(store_dir: Path) -> Path:
    """The folder of every stack's runs in a folder store."""
    return store_dir / RUNS


def stack_folder(store_dir: Path, stack_name: str) -> Path:
    return runs_folder(store_dir) / stack_name


def run_folder(store_dir: Path, stack_name: str, run_id: str) -> Path:
    return stack_folder(store_dir, stack_name) / run_id


def adapter_folder(store_dir: Path, stack_name: str, run_id: str) -> Path:
    """The stored copy of a run's adapter, the folder a server loads it from."""
    return run_folder(store_dir, stack_name, run_id) / ADAPTER_DIR


def index_files(store_dir: Path, stack_name: str) -> list[Path]:
    """Every run index of `stack_name` in a folder store, in name order."""
    return sorted(stack_folder(store_dir, stack_name).glob(f"*/{INDEX_NAME}"))


def indexes_of_run(store_dir: Path, run_id: str) -> list[Path]:
    """The index of run `run_id` under every stack that holds one (`run_id` a checked name)."""
    return sorted(runs_folder(store_dir).glob(f"*/{run_id}/{INDEX_NAME}"))


@dataclass
class RunWrite:
    """What `write_run` did: the files written, those that failed (name -> why) and the index, written only
    when none failed."""

    written: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    index: RunIndex | None = None


def write_run(put_file: Callable[[str, Path], None], put_bytes: Callable[[str, bytes], None], stack_name: str,
              run_id: str, files: Mapping[str, Path | bytes], index: Callable[[list[str]], RunIndex],
              caught: tuple[type[Exception], ...] = ()) -> RunWrite:
    """Write one run into a store through its `put_file`/`put_bytes` (key, content): every file of `files` (name
    within the run -> a local file or the bytes), in the given order, then, only if all were written, its index
    `index(written)` last. A `caught` error of one file is recorded and the others still written; any other
    error, and any error writing the index, propagates."""
    prefix = run_key(stack_name, run_id)
    done = RunWrite()
    for name, source in files.items():
        try:
            if isinstance(source, Path):
                put_file(f"{prefix}/{name}", source)
            else:
                put_bytes(f"{prefix}/{name}", source)
            done.written.append(name)
        except caught as exc:
            done.failed[name] = f"{source}: {exc}" if isinstance(source, Path) else str(exc)
    if not done.failed:
        done.index = index(list(done.written))
        put_bytes(index_key(stack_name, run_id), write_run_record(done.index).encode())
    return done
