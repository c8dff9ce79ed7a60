"""Adapters of stored runs, by name: which runs have one, what base each was trained on, and the set one server
serves (refusing an adapter of another base).

The run store's layout (`runs/<stack>/<run_id>/run.json`, the run manifest under `train/`) is read from a
folder here (the local store, or the cluster's shared filesystem); `ftstack adapters` lists the same entries
from any store through `adapter_entry`.
"""

from __future__ import annotations

import functools
from pathlib import Path

from documents.adapter_registry import AdapterEntry, EvalSummary, adapter_sha256
from documents.base import DocumentError
from documents.hf_files import read_adapter_config
from documents.run_config import RunConfig
from documents.run_manifest import RUN_MANIFEST_NAME, RunManifest, load_run_manifest, model_hash, read_run_manifest
from documents.run_record import RunIndex, read_run_record
from documents.sections.serve import model_name_problem

RUN_INDEX_NAME = "run.json"
STORED_MANIFEST = f"train/{RUN_MANIFEST_NAME}"
STORED_ADAPTER = "adapter"


class RegistryError(ValueError):
    """An adapter that cannot be served: unknown run, no adapter, another base, a bad name."""


class UnknownRun(RegistryError, LookupError):
    """No stored run has the asked id."""


def adapter_entry(name: str, run_id: str, manifest: RunManifest, index: RunIndex | None = None) -> AdapterEntry:
    """The entry of a run that finished training (its manifest names the adapter folder)."""
    if manifest.adapter is None:
        raise RegistryError(f"run {run_id!r} has no adapter (its training status is {manifest.status})")
    lora = ((manifest.config.get("train") or {}).get("lora") or {})
    evaluation = None
    if index is not None and index.perplexity_finetuned is not None:
        evaluation = EvalSummary(perplexity_base=index.perplexity_base, perplexity_finetuned=index.perplexity_finetuned,
                                 perplexity_improvement_pct=index.perplexity_improvement_pct)
    return AdapterEntry(
        name=name, run_id=run_id, run_name=index.run_name if index else manifest.run, adapter_dir=manifest.adapter,
        stack=index.stack if index else None,
        base_model_sha256=manifest.base_model.sha256, base_model_path=manifest.base_model.path,
        rank=lora.get("r", 16), dataset_sha256=manifest.dataset.sha256, evaluation=evaluation,
    )


def stored_runs(store_dir: Path) -> dict[str, tuple[RunIndex, RunManifest]]:
    """Run id -> (index, manifest) for every stored run with a run manifest, in a store folder."""
    found: dict[str, tuple[RunIndex, RunManifest]] = {}
    for index_file in sorted(store_dir.glob(f"runs/*/*/{RUN_INDEX_NAME}")):
        manifest_file = index_file.parent / STORED_MANIFEST
        if not manifest_file.is_file():
            continue
        try:
            index = read_run_record(index_file.read_bytes(), str(index_file))
            manifest = read_run_manifest(manifest_file.read_bytes(), str(manifest_file))
        except (DocumentError, OSError) as exc:
            raise RegistryError(str(exc)) from None
        found[index.run_id] = (index, manifest)
    return found


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


def resolve_adapters(run: RunConfig, wanted: dict[str, str], store_dir: Path, default_name: str) -> list[AdapterEntry]:
    """The adapters to serve on the run's base: `wanted` (name -> run id) from the store, else the run's own."""
    base_sha, base_path = served_base(run)
    if not wanted:
        own = check_base(current_run_adapter(run, default_name), base_sha, base_path)
        return [verified(own, [Path(own.adapter_dir)])]
    runs = stored_runs(store_dir)
    return [stored_adapter(runs, store_dir, name, run_id, base_sha, base_path) for name, run_id in wanted.items()]


def stored_adapter(runs: dict[str, tuple[RunIndex, RunManifest]], store_dir: Path, name: str, run_id: str,
                   base_sha: str, base_path: str) -> AdapterEntry:
    """The stored run's adapter under `name`: the store's own copy (`runs/<stack>/<run_id>/adapter`), its hash as
    the run index records it, checked against the served base and the files."""
    if run_id not in runs:
        raise UnknownRun(f"adapter {name!r}: no stored run {run_id!r} in {store_dir} (stored: {sorted(runs) or 'none'})")
    index, manifest = runs[run_id]
    entry = adapter_entry(name, run_id, manifest, index)
    if index.adapter_sha256 is None:
        raise RegistryError(f"adapter {name!r}: stored run {run_id!r} holds no adapter files in {store_dir} "
                            "(stored before adapters were kept with the run: upload it again)")
    folder = store_dir / "runs" / index.stack / run_id / STORED_ADAPTER
    entry = entry.model_copy(update={"adapter_dir": str(folder), "adapter_sha256": index.adapter_sha256})
    return verified(check_base(entry, base_sha, base_path), [store_dir])


def verified(entry: AdapterEntry, roots: list[Path]) -> AdapterEntry:
    """The entry when its folder (symlinks resolved) lies under one of `roots` and its files still hash to
    `adapter_sha256`; else RegistryError naming what differs."""
    folder = Path(entry.adapter_dir).resolve()
    if not any(folder.is_relative_to(root.resolve()) for root in roots):
        raise RegistryError(f"adapter {entry.name!r}: {entry.adapter_dir} is outside the run store "
                            f"({', '.join(str(r) for r in roots)}): refused")
    try:
        found = adapter_sha256(folder)
    except OSError as error:
        raise RegistryError(f"adapter {entry.name!r}: {error}") from None
    if entry.adapter_sha256 is not None and found != entry.adapter_sha256:
        raise RegistryError(f"adapter {entry.name!r} (run {entry.run_id}): the files in {entry.adapter_dir} hash to "
                            f"{found[:16]}, the registry recorded {entry.adapter_sha256[:16]}: changed since stored, refused")
    return entry.model_copy(update={"adapter_sha256": found})


def run_of_path(runs: dict[str, tuple[RunIndex, RunManifest]], store_dir: Path, path: str) -> str | None:
    """The id of the stored run whose adapter folder in the store is `path` (vLLM's lora_path), else None."""
    wanted = Path(path).resolve()
    for run_id, (index, _) in runs.items():
        if (store_dir / "runs" / index.stack / run_id / STORED_ADAPTER).resolve() == wanted:
            return run_id
    return None


def recheck_served(run: RunConfig, entry: AdapterEntry, store_dir: Path) -> AdapterEntry:
    """A persisted served adapter checked again: a stored run's from the store (as a fresh load), the run's own
    from its folder, with the hash it was served with."""
    base_sha, base_path = served_base(run)
    runs = stored_runs(store_dir)
    if entry.run_id in runs:
        return stored_adapter(runs, store_dir, entry.name, entry.run_id, base_sha, base_path)
    own = current_run_adapter(run, entry.name)
    if Path(own.adapter_dir).resolve() != Path(entry.adapter_dir).resolve():
        raise RegistryError(f"adapter {entry.name!r}: {entry.adapter_dir} is neither a stored run's adapter nor "
                            "this run's own: refused")
    own = own.model_copy(update={"adapter_sha256": entry.adapter_sha256})
    return verified(check_base(own, base_sha, base_path), [Path(own.adapter_dir)])
