"""One owner of the run store's layout (issue 61 item 2): documents/run_store.py spells `runs/<stack>/<run_id>/`
and `run.json` and writes a run's index last; no other module of the project spells a path of the store, and both
writers (`ftstack run`'s upload and the publish stage) write through it into the same layout."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from documents.run_record import RunIndex, read_run_record
from documents.run_store import write_run

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("documents", "infra", "workloads", "policies", "planning", "bench")
OWNER = ROOT / "documents/run_store.py"
STORE_PATH = re.compile(r"""(?:^|[\s/'"(`])runs/$|run\.json""")
"""a string that ends (a piece of an f-string) with the store's folder (`runs/`, `.../runs/`), or names the index;
`"runs"` alone counts where it joins a path (`store / "runs"`): elsewhere it is the `ftstack runs` command"""


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            found.add(id(body[0].value))
        if isinstance(body, list):  # attribute docstrings: a string statement after an assignment
            for before, after in zip(body, body[1:]):
                if isinstance(before, (ast.Assign, ast.AnnAssign)) and isinstance(after, ast.Expr):
                    found.add(id(after.value))
    return found


def store_paths(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = docstrings(tree)
    joined = {id(side) for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
              for side in (node.left, node.right)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if STORE_PATH.search(node.value) or (node.value == "runs" and id(node) in joined):
                yield node.lineno, node.value


def test_the_scan_finds_what_it_is_meant_to_find(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""Docstrings may say runs/<stack>/<run_id>/run.json."""\n'
                      'A = store / "runs" / stack\nB = f"runs/{stack}/{run_id}"\nC = f"{root}/runs/{x}"\n'
                      'D = "run.json"\nE = "5 runs/month"\nF = "stored runs"\nG = ("runs", "status")\n')
    assert sorted(line for line, _ in store_paths(sample)) == [2, 3, 4, 5]


def test_no_module_but_the_owner_spells_a_path_of_the_run_store() -> None:
    found = {f"{path.relative_to(ROOT)}:{line}": text for folder in FOLDERS if (ROOT / folder).is_dir()
             for path in sorted((ROOT / folder).rglob("*.py")) if path != OWNER for line, text in store_paths(path)}
    assert not found, f"the run store's paths are documents/run_store.py's to spell: {found}"


def index(stack: str, run_id: str, files: list[str]) -> RunIndex:
    return RunIndex(stack=stack, run_id=run_id, uploaded_at="2026-12-01T00:00:00+00:00", files=files)


def test_the_index_is_written_last_and_lists_what_was_written(tmp_path: Path) -> None:
    source = tmp_path / "adapter_config.json"
    source.write_text("{}")
    order: list[str] = []
    done = write_run(lambda key, path: order.append(key), lambda key, data: order.append(key), "local", "r1",
                     {"adapter/adapter_config.json": source, "outputs.json": b"{}"},
                     lambda written: index("local", "r1", sorted(written)))
    assert order == ["runs/local/r1/adapter/adapter_config.json", "runs/local/r1/outputs.json", "runs/local/r1/run.json"]
    assert done.index is not None and done.index.files == ["adapter/adapter_config.json", "outputs.json"]


def test_a_failed_file_leaves_the_run_without_an_index(tmp_path: Path) -> None:
    """A reader who finds no index never sees a half-written run; the failure names the file and why."""
    written: dict[str, bytes] = {}

    def put_file(key: str, path: Path) -> None:
        written[key] = path.read_bytes()

    done = write_run(put_file, written.__setitem__, "local", "r1",
                     {"train/run_manifest.json": tmp_path / "missing.json", "outputs.json": b"{}"},
                     lambda names: index("local", "r1", names), caught=(OSError,))
    assert done.index is None and list(written) == ["runs/local/r1/outputs.json"]
    assert done.failed.keys() == {"train/run_manifest.json"} and "missing.json" in done.failed["train/run_manifest.json"]


def test_an_error_not_caught_stops_the_write(tmp_path: Path) -> None:
    written: dict[str, bytes] = {}
    with pytest.raises(FileNotFoundError):
        write_run(lambda key, path: written.setdefault(key, path.read_bytes()), written.__setitem__, "local", "r1",
                  {"train/run_manifest.json": tmp_path / "missing.json"}, lambda names: index("local", "r1", names))
    assert written == {}


def test_both_writers_store_a_run_in_one_layout(tmp_path: Path) -> None:
    """`ftstack run`'s LocalStore upload path and the publish stage's folder copy: the same keys, read back by the
    serving registry's folder walk."""
    from infra.runs.store import LocalStore
    from workloads.serve.registry import stored_runs

    store = LocalStore(tmp_path / "store")
    manifest = tmp_path / "run_manifest.json"
    manifest.write_text("{}")
    write_run(store.put_file, store.put_bytes, "local", "r1", {"train/run_manifest.json": manifest},
              lambda names: index("local", "r1", names))
    assert sorted(store.list_keys("")) == ["runs/local/r1/run.json", "runs/local/r1/train/run_manifest.json"]
    stored = read_run_record(store.get_bytes("runs/local/r1/run.json"), "run.json")
    assert stored.files == ["train/run_manifest.json"]
    runs = stored_runs(tmp_path / "store", "local")
    assert "r1" in runs.damaged  # an empty manifest: found where the registry looks, and refused by name

    from document_fixtures import evaluator_report, side
    from documents.adapter_registry import ADAPTER_FILES
    from documents.run_config import parse_run_config
    from workloads.serve import publish

    run = parse_run_config({"name": "pub", "paths": {"root": str(tmp_path / "work")}, "model": {"source": "dir:x"},
                            "data": {"source": "sample", "rows": 4}}, "publish")
    run.adapter_dir.mkdir(parents=True)
    for name in ADAPTER_FILES:
        (run.adapter_dir / name).write_text(name)
    (run.train_run_dir / "run_manifest.json").write_text("{}")
    report = evaluator_report(job_id="41", base=side(8.0, 30.0), finetuned=side(6.0, 28.0), run="pub")
    publish.store_run(run, report, tmp_path / "published", "local", "r1", "41")
    published = LocalStore(tmp_path / "published")
    assert sorted(published.list_keys("")) == ["runs/local/r1/adapter/adapter_config.json",
                                               "runs/local/r1/adapter/adapter_model.safetensors",
                                               "runs/local/r1/run.json", "runs/local/r1/train/run_manifest.json"]
    assert read_run_record(published.get_bytes("runs/local/r1/run.json"), "run.json").files == [
        "adapter/adapter_config.json", "adapter/adapter_model.safetensors", "train/run_manifest.json"]
    assert "r1" in stored_runs(tmp_path / "published", "local").damaged
