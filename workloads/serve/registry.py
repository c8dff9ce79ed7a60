"""Adapters of stored runs, by name: which runs have one, what base each was trained on, and the set one server
serves (refusing an adapter of another base).

The run store's layout (documents.run_store: a folder per run of a stack, its index, its run manifest and its
adapter's copy) is read from a folder here (the local store, or the cluster's shared filesystem); `ftstack adapters` lists the same entries
from any store through `adapter_entry`. A server reads the runs of its own stack only: a run id names a run
within one stack, and the same id may be another stack's run too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from documents.adapter_registry import AdapterEntry, EvalSummary
from documents.base import DocumentError
from documents.hf_files import read_adapter_config
from documents.names import checked_name
from documents.run_config import RunConfig
from documents.run_manifest import RUN_MANIFEST_NAME, RunManifest, load_run_manifest, model_hash, read_run_manifest
from documents.run_record import RunIndex, read_run_record
from documents.run_store import (ADAPTER_DIR, INDEX_NAME, MANIFEST_KEY, adapter_folder, index_files, indexes_of_run,
                                 run_key, runs_folder)
from documents.sections.serve import model_name_problem, shown
from planning.serving import manifest_rank
from workloads.serve.adapter_files import AdapterFileError, AdapterFiles, read_adapter, read_stored_adapter


class RegistryError(ValueError):
    """An adapter that cannot be served: unknown run, no adapter, another base, a bad name."""


class UnknownRun(RegistryError, LookupError):
    """No stored run has the asked id."""


def adapter_entry(name: str, run_id: str, manifest: RunManifest, index: RunIndex | None = None) -> AdapterEntry:
    """The entry of a run that finished training (its manifest names the adapter folder)."""
    if manifest.adapter is None:
        raise RegistryError(f"run {run_id!r} has no adapter (its training status is {manifest.status})")
    evaluation = None
    if index is not None and index.perplexity_finetuned is not None:
        evaluation = EvalSummary(perplexity_base=index.perplexity_base, perplexity_finetuned=index.perplexity_finetuned,
                                 perplexity_improvement_pct=index.perplexity_improvement_pct)
    return AdapterEntry(
        name=name, run_id=run_id, run_name=index.run_name if index else manifest.run, adapter_dir=manifest.adapter,
        stack=index.stack if index else None,
        base_model_sha256=manifest.base_model.sha256, base_model_path=manifest.base_model.path,
        rank=manifest_rank(manifest), dataset_sha256=manifest.dataset.sha256, evaluation=evaluation,
    )


class OtherStackRun(RegistryError):
    """The run id is stored for another stack only."""


@dataclass(frozen=True)
class StoredRuns:
    """The runs of one stack in a store folder: the readable ones, and the damaged ones with why (one damaged run
    is refused by name; it does not make every other run unusable)."""

    readable: dict[str, tuple[RunIndex, RunManifest]]
    damaged: dict[str, str]


def stored_runs(store_dir: Path, stack_name: str | None) -> StoredRuns:
    """Every run of `stack_name` with a run manifest in a store folder (its runs' folders); each index must name
    the stack and run id its folder does, else the run is listed as damaged, as one that cannot be read."""
    if stack_name is None:
        raise RegistryError("this server does not know which stack it serves, and the run store keeps runs per "
                            f"stack ({run_key('<stack>', '<run_id>')}): start it with --stack NAME (the pipeline's "
                            "serve job does) or set serve.stack")
    found: dict[str, tuple[RunIndex, RunManifest]] = {}
    damaged: dict[str, str] = {}
    for index_file in index_files(store_dir, stack_name):
        manifest_file = index_file.parent / MANIFEST_KEY
        if not manifest_file.is_file():
            continue
        run_id = index_file.parent.name
        try:
            index = read_run_record(index_file.read_bytes(), str(index_file))
            manifest = read_run_manifest(manifest_file.read_bytes(), str(manifest_file))
        except (DocumentError, OSError) as exc:
            damaged[run_id] = str(exc)
            continue
        if (index.stack, index.run_id) != (stack_name, run_id):
            damaged[run_id] = (f"{index_file}: names stack {index.stack!r} and run {index.run_id!r}, but lies in "
                               f"{run_key(stack_name, run_id)}/")
            continue
        found[run_id] = (index, manifest)
    return StoredRuns(found, damaged)


def stored_ranks(runs: StoredRuns) -> list[int]:
    """The adapter rank each readable stored run with an adapter trained (its manifest's train.lora.r)."""
    return [manifest_rank(manifest) for _, manifest in runs.readable.values() if manifest.adapter is not None]


def stacks_holding(store_dir: Path, run_id: str) -> list[str]:
    """The stacks whose folder in the store holds a run `run_id` (none for a name that is no run id)."""
    try:
        checked_name(run_id, "run id")
    except ValueError:
        return []
    return sorted(index.parent.parent.name for index in indexes_of_run(store_dir, run_id))


def other_stack(name: str | None, run_id: str, stacks: list[str], store_dir: Path,
                stack_name: str | None) -> OtherStackRun:
    adapter = f"adapter {name!r}: " if name else ""
    return OtherStackRun(f"{adapter}run {run_id!r} is a run of stack {', '.join(map(repr, stacks))} "
                         f"({run_key(stacks[0], run_id)} in {store_dir}), and this server serves stack {stack_name!r}: "
                         "refused (serve it from a server of that stack)")


def parse_adapter_flags(items: list[str]) -> dict[str, str]:
    """`NAME=RUN_ID` flags as name -> run id."""
    wanted: dict[str, str] = {}
    for item in items:
        name, sep, run_id = item.partition("=")
        if not sep or not run_id:
            raise RegistryError(f"--adapter {item!r}: expected NAME=RUN_ID")
        if problem := model_name_problem(name):
            raise RegistryError(f"--adapter NAME=RUN_ID: the name {problem}")
        if name in wanted:
            raise RegistryError(f"--adapter {name!r} is given twice")
        wanted[name] = run_id
    return wanted


def served_base(run: RunConfig) -> tuple[str, str]:
    """(sha256, path) of the base model this server serves (from its prepare manifest when it has one)."""
    return _base_digest(run.base_model_dir)


@functools.cache
def _base_digest(folder: Path) -> tuple[str, str]:
    """Hashed once per process: without a prepare manifest that is every weight file of the base."""
    digest = model_hash(folder)
    return digest["sha256"], digest["path"]


def check_base(entry: AdapterEntry, base_sha: str, base_path: str) -> AdapterEntry:
    if entry.base_model_sha256 != base_sha:
        raise RegistryError(
            f"adapter {entry.name!r} (run {entry.run_id}) was trained on base {entry.base_model_path} "
            f"(sha256 {entry.base_model_sha256[:16]}), but this server serves base {base_path} "
            f"(sha256 {base_sha[:16]}): refused")
    if not (Path(entry.adapter_dir) / "adapter_config.json").is_file():
        raise RegistryError(f"adapter {entry.name!r} (run {entry.run_id}): {entry.adapter_dir} has no adapter_config.json")
    return entry


def current_run_adapter(run: RunConfig, name: str) -> AdapterEntry:
    """Today's default: the run config's own adapter, under `name` (trained here on the served base, when no run
    manifest says otherwise)."""
    manifest = load_run_manifest(run.train_run_dir / RUN_MANIFEST_NAME)
    if manifest is not None and manifest.adapter is not None:
        return adapter_entry(name, run.name, manifest)
    sha, path = served_base(run)
    return AdapterEntry(name=name, run_id=run.name, run_name=run.name, adapter_dir=str(run.adapter_dir),
                        base_model_sha256=sha, base_model_path=path, rank=read_adapter_config(run.adapter_dir).r)


def resolve_adapters(run: RunConfig, wanted: dict[str, str], store_dir: Path, stack_name: str | None,
                     default_name: str) -> list[AdapterEntry]:
    """The adapters to serve on the run's base: `wanted` (name -> run id) from the store's runs of `stack_name`, else
    the run's own."""
    base_sha, base_path = served_base(run)
    if not wanted:
        own = check_base(current_run_adapter(run, default_name), base_sha, base_path)
        return [verified(own, own_files(own))]
    runs = stored_runs(store_dir, stack_name)
    return [stored_adapter(runs, store_dir, stack_name, name, run_id, base_sha, base_path)
            for name, run_id in wanted.items()]


def stored_adapter(runs: StoredRuns, store_dir: Path, stack_name: str | None, name: str, run_id: str, base_sha: str,
                   base_path: str) -> AdapterEntry:
    """The stored run's adapter under `name` (`stored_adapter_files` without the files)."""
    return stored_adapter_files(runs, store_dir, stack_name, name, run_id, base_sha, base_path)[0]


def stored_adapter_files(runs: StoredRuns, store_dir: Path, stack_name: str | None, name: str, run_id: str,
                         base_sha: str, base_path: str) -> tuple[AdapterEntry, AdapterFiles]:
    """The stored run's adapter under `name` and the files read: the store's own copy
    (documents.run_store.adapter_folder), its hash as the run index records it, checked against the served base
    and the bytes read (no link in the stored run: workloads.serve.adapter_files); a run of another stack is
    refused, naming that stack, and a damaged run naming why."""
    if run_id in runs.damaged:
        raise RegistryError(f"adapter {name!r}: stored run {run_id!r} is damaged: {runs.damaged[run_id]}")
    if run_id not in runs.readable:
        if others := stacks_holding(store_dir, run_id):
            raise other_stack(name, run_id, others, store_dir, stack_name)
        damaged = f"; damaged: {sorted(runs.damaged)}" if runs.damaged else ""
        raise UnknownRun(f"adapter {name!r}: no run {shown(run_id)} of stack {stack_name!r} in {store_dir} "
                         f"(stored: {sorted(runs.readable) or 'none'}{damaged})")
    index, manifest = runs.readable[run_id]
    entry = adapter_entry(name, run_id, manifest, index)
    if index.adapter_sha256 is None:
        raise RegistryError(f"adapter {name!r}: stored run {run_id!r} holds no adapter files in {store_dir} "
                            "(stored before adapters were kept with the run: upload it again)")
    try:
        files = read_stored_adapter(store_dir, index.stack, run_id)
    except (AdapterFileError, OSError) as problem:
        raise RegistryError(f"adapter {name!r}: {problem}") from None
    entry = entry.model_copy(update={"adapter_dir": str(files.folder), "adapter_sha256": index.adapter_sha256})
    return verified(check_base(entry, base_sha, base_path), files), files


def own_files(entry: AdapterEntry) -> AdapterFiles:
    """The files of the run's own adapter folder (no link followed in it)."""
    try:
        return read_adapter(Path(entry.adapter_dir))
    except (AdapterFileError, OSError) as problem:
        raise RegistryError(f"adapter {entry.name!r}: {problem}") from None


def verified(entry: AdapterEntry, files: AdapterFiles) -> AdapterEntry:
    """The entry when the files read still hash to its `adapter_sha256`; else RegistryError naming what differs."""
    found = files.sha256
    if entry.adapter_sha256 is not None and found != entry.adapter_sha256:
        raise RegistryError(f"adapter {entry.name!r} (run {entry.run_id}): the files in {entry.adapter_dir} hash to "
                            f"{found[:16]}, the registry recorded {entry.adapter_sha256[:16]}: changed since stored, refused")
    return entry.model_copy(update={"adapter_sha256": found})


def run_of_path(runs: StoredRuns, store_dir: Path, stack_name: str | None, path: str) -> str | None:
    """The id of the stored run of `stack_name` whose adapter folder in the store is `path` (vLLM's lora_path; a
    relative path is the store's, as the docs show), else None; another stack's
    adapter folder is refused, naming that stack, and a damaged run's naming why."""
    wanted = (store_dir / path).resolve()
    for run_id, (index, _) in runs.readable.items():
        if adapter_folder(store_dir, index.stack, run_id).resolve() == wanted:
            return run_id
    stored = runs_folder(store_dir).resolve()
    if wanted.name == ADAPTER_DIR and wanted.parent.parent.name == stack_name and wanted.parent.name in runs.damaged:
        raise RegistryError(f"stored run {wanted.parent.name!r} is damaged: {runs.damaged[wanted.parent.name]}")
    if wanted.name == ADAPTER_DIR and wanted.parent.parent.parent == stored and (wanted.parent / INDEX_NAME).is_file():
        raise other_stack(None, wanted.parent.name, [wanted.parent.parent.name], store_dir, stack_name)
    return None


def recheck_served(run: RunConfig, entry: AdapterEntry, store_dir: Path, stack_name: str | None) -> AdapterEntry:
    """A persisted served adapter checked again: a stored run's from the store (as a fresh load), the run's own
    from its folder, with the hash it was served with."""
    base_sha, base_path = served_base(run)
    if entry.stack is not None:
        if entry.stack != stack_name:
            raise other_stack(entry.name, entry.run_id, [entry.stack], store_dir, stack_name)
        return stored_adapter(stored_runs(store_dir, stack_name), store_dir, stack_name, entry.name, entry.run_id,
                              base_sha, base_path)
    own = current_run_adapter(run, entry.name)
    if Path(own.adapter_dir).resolve() != Path(entry.adapter_dir).resolve():
        raise RegistryError(f"adapter {entry.name!r}: {entry.adapter_dir} is neither a stored run's adapter nor "
                            "this run's own: refused")
    own = own.model_copy(update={"adapter_sha256": entry.adapter_sha256})
    return verified(check_base(own, base_sha, base_path), own_files(own))
