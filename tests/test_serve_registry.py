"""Stored adapters as a server may load them: the run store keeps the adapter's files and their hash at upload;
the registry serves only the store's copy, refuses a folder that leaves the store and files that changed, and
maps vLLM's lora_path back to its run (no model: placeholder weight files)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from adapter_runs import STACK, register_run

from documents.run_manifest import model_hash
from documents.run_record import read_run_record
from infra.runs.store import LocalStore
from workloads.serve.registry import OtherStackRun, RegistryError, UnknownRun, run_of_path, stored_adapter, stored_runs


def fake_adapter(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict]:
    base = tmp_path / "base"
    base.mkdir()
    (base / "model.safetensors").write_bytes(b"base weights")
    for run_id, weights in (("run-a", b"A" * 64), ("run-b", b"B" * 64)):
        register_run(LocalStore(tmp_path / "store"), tmp_path / "runs", run_id, base,
                     fake_adapter(tmp_path / "trained" / run_id, weights), 4)
    digest = model_hash(base)
    return tmp_path / "store", {"base_sha": digest["sha256"], "base_path": digest["path"]}


def by_hand(config: bytes, weights: bytes) -> str:
    """The documented hash: sha256 over each file's name, a NUL and its bytes, config first."""
    return hashlib.sha256(b"adapter_config.json\0" + config + b"adapter_model.safetensors\0" + weights).hexdigest()


def test_upload_keeps_the_adapter_and_its_hash(store) -> None:
    root, _ = store
    folder = root / "runs" / STACK / "run-a" / "adapter"
    assert (folder / "adapter_model.safetensors").read_bytes() == b"A" * 64
    index = read_run_record((root / "runs" / STACK / "run-a" / "run.json").read_text(), "run.json")
    assert index.adapter_sha256 == by_hand((folder / "adapter_config.json").read_bytes(), b"A" * 64)
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"} <= set(index.files)


def test_the_store_copy_is_served_and_checked(store, tmp_path: Path) -> None:
    root, base = store
    runs = stored_runs(root, STACK)
    entry = stored_adapter(runs, root, STACK, "desk-a", "run-a", **base)
    assert Path(entry.adapter_dir) == root / "runs" / STACK / "run-a" / "adapter"
    assert entry.adapter_sha256 == runs.readable["run-a"][0].adapter_sha256

    (root / "runs" / STACK / "run-b" / "adapter" / "adapter_model.safetensors").write_bytes(b"B" * 63 + b"C")
    with pytest.raises(RegistryError, match="changed since stored"):
        stored_adapter(runs, root, STACK, "desk-b", "run-b", **base)

    stored = root / "runs" / STACK / "run-a" / "adapter"
    outside = fake_adapter(tmp_path / "elsewhere", b"A" * 64)
    for item in stored.iterdir():
        item.unlink()
    stored.rmdir()
    stored.symlink_to(outside)
    (outside / "adapter_config.json").unlink()  # refused before anything behind the link is read (issue 54, item 6)
    with pytest.raises(RegistryError, match="is a symbolic link, which may lead outside the run store .*refused unread"):
        stored_adapter(runs, root, STACK, "desk-a", "run-a", **base)


def test_lora_path_maps_only_a_stored_adapter_folder(store, tmp_path: Path) -> None:
    root, _ = store
    runs = stored_runs(root, STACK)
    assert run_of_path(runs, root, STACK, str(root / "runs" / STACK / "run-b" / "adapter")) == "run-b"
    assert run_of_path(runs, root, STACK, str(root / "runs" / STACK / "run-b" / "adapter" / ".." / "adapter")) == "run-b"
    assert run_of_path(runs, root, STACK, str(tmp_path / "trained" / "run-b")) is None
    assert run_of_path(runs, root, STACK, str(root / "runs" / STACK / "run-b")) is None


def test_lora_path_relative_to_the_store_is_the_form_the_docs_show(store, monkeypatch, tmp_path: Path) -> None:
    """Issue 54, item 6: `lora_path: "runs/local/R2/adapter"` (docs/evaluation-and-serving.md) is the store's
    folder, whatever the server's working directory."""
    root, _ = store
    monkeypatch.chdir(tmp_path / "trained")
    runs = stored_runs(root, STACK)
    assert run_of_path(runs, root, STACK, f"runs/{STACK}/run-b/adapter") == "run-b"
    assert run_of_path(runs, root, STACK, "run-b/adapter") is None


def test_a_server_reads_the_runs_of_its_own_stack_only(store, tmp_path: Path) -> None:
    """Issue 42, item 5: every stack's runs were one dict keyed by run id, so a run of the rehearsal cluster was
    served by the local server, and of two stacks with the same run id one silently replaced the other."""
    root, base = store
    base_dir = tmp_path / "base"
    register_run(LocalStore(root), tmp_path / "cluster-runs", "run-a", base_dir,
                 fake_adapter(tmp_path / "cluster-trained" / "run-a", b"X" * 64), 4, stack="cluster")
    register_run(LocalStore(root), tmp_path / "cluster-runs", "run-c", base_dir,
                 fake_adapter(tmp_path / "cluster-trained" / "run-c", b"C" * 64), 4, stack="cluster")

    local = stored_runs(root, STACK)
    assert set(local.readable) == {"run-a", "run-b"} and set(stored_runs(root, "cluster").readable) == {"run-a", "run-c"}
    entry = stored_adapter(local, root, STACK, "desk-a", "run-a", **base)
    assert (entry.stack, Path(entry.adapter_dir)) == (STACK, root / "runs" / STACK / "run-a" / "adapter")
    assert (Path(entry.adapter_dir) / "adapter_model.safetensors").read_bytes() == b"A" * 64
    rehearsal = stored_adapter(stored_runs(root, "cluster"), root, "cluster", "desk-a", "run-a", **base)
    assert (Path(rehearsal.adapter_dir) / "adapter_model.safetensors").read_bytes() == b"X" * 64

    with pytest.raises(OtherStackRun, match=r"run 'run-c' is a run of stack 'cluster' .*serves stack 'local': refused"):
        stored_adapter(local, root, STACK, "desk-c", "run-c", **base)
    with pytest.raises(OtherStackRun, match="stack 'cluster'"):
        run_of_path(local, root, STACK, str(root / "runs" / "cluster" / "run-c" / "adapter"))
    with pytest.raises(UnknownRun, match="no run 'run-z' of stack 'local'"):
        stored_adapter(local, root, STACK, "desk-z", "run-z", **base)
    with pytest.raises(UnknownRun):
        stored_adapter(local, root, STACK, "desk-z", "../cluster/run-c", **base)
    with pytest.raises(RegistryError, match="does not know which stack it serves"):
        stored_runs(root, None)


def test_a_run_index_in_another_stacks_folder_is_refused(store) -> None:
    root, base = store
    moved = root / "runs" / "cluster" / "run-a"
    moved.parent.mkdir(parents=True)
    (root / "runs" / STACK / "run-a").rename(moved)
    runs = stored_runs(root, "cluster")
    assert runs.readable == {} and "names stack 'local' and run 'run-a', but lies in runs/cluster/run-a/" in runs.damaged["run-a"]
    with pytest.raises(RegistryError, match=r"stored run 'run-a' is damaged: .*lies in runs/cluster/run-a/"):
        stored_adapter(runs, root, "cluster", "desk-a", "run-a", **base)


def test_one_damaged_run_leaves_the_others_loadable(store) -> None:
    """Issue 54, item 2: a truncated run.json beside healthy runs made every load fail naming the damaged run."""
    root, base = store
    index = root / "runs" / STACK / "run-b" / "run.json"
    index.write_bytes(index.read_bytes()[:40])
    runs = stored_runs(root, STACK)
    assert set(runs.readable) == {"run-a"} and set(runs.damaged) == {"run-b"} and str(index) in runs.damaged["run-b"]
    assert stored_adapter(runs, root, STACK, "desk-a", "run-a", **base).run_id == "run-a"
    with pytest.raises(RegistryError, match=f"stored run 'run-b' is damaged: {index}"):
        stored_adapter(runs, root, STACK, "desk-b", "run-b", **base)
    with pytest.raises(RegistryError, match="stored run 'run-b' is damaged"):
        run_of_path(runs, root, STACK, f"runs/{STACK}/run-b/adapter")
    with pytest.raises(UnknownRun, match=r"\(stored: \['run-a'\]; damaged: \['run-b'\]\)"):
        stored_adapter(runs, root, STACK, "desk-z", "run-z", **base)


def test_a_long_run_id_is_quoted_cut(store) -> None:
    """Issue 54, item 8: a 10,000-character name is not echoed whole."""
    root, base = store
    with pytest.raises(UnknownRun) as unknown:
        stored_adapter(stored_runs(root, STACK), root, STACK, "desk-z", "r" * 10_000, **base)
    assert "... (10000 characters)" in str(unknown.value) and len(str(unknown.value)) < 500


def test_a_link_inside_a_stored_run_is_refused_unread(store, tmp_path: Path) -> None:
    """Issue 64, item 1, the probe: `ln -sf /outside/adapter_model.safetensors runs/local/R/adapter/` (the same
    bytes, so the recorded hash matches), then `/v1/load_lora_adapter {"lora_path": "R"}` answered 200 on both
    engines. Any link in a stored run (a file, a folder, the run's own folder) is refused before it is read."""
    root, base = store
    weights = root / "runs" / STACK / "run-a" / "adapter" / "adapter_model.safetensors"
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(weights.read_bytes())
    weights.unlink()
    weights.symlink_to(outside)
    with pytest.raises(RegistryError, match=r"run-a/adapter/adapter_model.safetensors is a symbolic link.*refused unread"):
        stored_adapter(stored_runs(root, STACK), root, STACK, "desk-a", "run-a", **base)
    weights.unlink()
    weights.write_bytes(outside.read_bytes())
    assert stored_adapter(stored_runs(root, STACK), root, STACK, "desk-a", "run-a", **base).run_id == "run-a"

    (root / "runs" / STACK / "run-b" / "eval").mkdir(exist_ok=True)
    (root / "runs" / STACK / "run-b" / "eval" / "notes").symlink_to("/etc/hostname")
    with pytest.raises(RegistryError, match=r"run-b/eval/notes is a symbolic link"):
        stored_adapter(stored_runs(root, STACK), root, STACK, "desk-b", "run-b", **base)

    moved = tmp_path / "elsewhere-run-a"
    (root / "runs" / STACK / "run-a").rename(moved)
    (root / "runs" / STACK / "run-a").symlink_to(moved)
    with pytest.raises(RegistryError, match=rf"runs/{STACK}/run-a is a symbolic link"):
        stored_adapter(stored_runs(root, STACK), root, STACK, "desk-a", "run-a", **base)
