"""WorkloadBundle: the `workloads/`, `planning/` and `documents/` packages (code, job scripts, run configs, the planner,
the models of the documents jobs write) uploaded once per content hash.

The bundle lands in `<code_root>/<hash>` (for a cluster: `<jail>/home/shared/finetune_code/<hash>`),
uploaded atomically by the transport; a `current` link is then switched to it with one rename.
Unchanged content uploads nothing. Old versions are kept: queued jobs may still run from them.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult

from infra.pipeline.connect import open_transport
from infra.pipeline.transport import Transport
from infra.dynamic_resource import DynamicResource

PACKAGE = "workloads"
PACKAGES = (PACKAGE, "planning", "documents")
"""what ships: the jobs, the planner the trainer checks its plan with, and the document models they write and read."""
_SKIP_DIRS = {"__pycache__", ".pytest_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


def bundle_files(source_dir: str | Path) -> list[Path]:
    """The files of each shipped package under `source_dir`, as paths relative to source_dir, sorted."""
    root = Path(source_dir)
    files = []
    for name in PACKAGES:
        package = root / name
        if not (package / "__init__.py").is_file():
            raise FileNotFoundError(f"{package} is not a Python package (no __init__.py)")
        for path in package.rglob("*"):
            rel = path.relative_to(root)
            if any(part in _SKIP_DIRS for part in rel.parts) or path.suffix in _SKIP_SUFFIXES or not path.is_file():
                continue
            files.append(rel)
    return sorted(files)


def bundle_hash(source_dir: str | Path) -> str:
    """sha256 over each shipped file's path, executable bit and content (first 16 hex digits)."""
    digest = hashlib.sha256()
    root = Path(source_dir)
    for rel in bundle_files(root):
        path = root / rel
        digest.update(f"{rel.as_posix()}\0{path.stat().st_mode & 0o111:o}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def stage_bundle(source_dir: str | Path, dest: Path) -> str:
    """Copy the shipped files under dest and return their hash (computed on the copy)."""
    root = Path(source_dir)
    for rel in bundle_files(root):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)
    return bundle_hash(dest)


def upload_bundle(transport: Transport, source_dir: str | Path, code_root: str) -> dict[str, Any]:
    """Upload unless `<code_root>/<hash>` exists, then point `<code_root>/current` at it."""
    with tempfile.TemporaryDirectory(prefix="ft-bundle-") as tmp:
        content_hash = stage_bundle(source_dir, Path(tmp))
        path = f"{code_root.rstrip('/')}/{content_hash}"
        exists = transport.run(["test", "-d", path], timeout=60).ok
        if not exists:
            transport.put_directory(tmp, path)
    current = f"{code_root.rstrip('/')}/current"
    link_tmp = f"{code_root.rstrip('/')}/.current.tmp"
    transport.run(
        f"ln -sfn {shlex.quote(content_hash)} {shlex.quote(link_tmp)} && mv -Tf {shlex.quote(link_tmp)} {shlex.quote(current)}",
        timeout=60,
    ).check()
    return {"content_hash": content_hash, "path": path, "current": current, "uploaded": not exists}


class WorkloadBundleProvider(ResourceProvider):
    """Inputs: source_dir, code_root, transport (spec, see open_transport), content_hash (computed by the program)."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = upload_bundle(open_transport(props["transport"]), props["source_dir"], props["code_root"])
        return CreateResult(id_=f"{props['code_root'].rstrip('/')}", outs={**props, **outs})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in ("code_root",) if olds.get(k) != news.get(k)]
        changed = replaces or [k for k in ("content_hash", "transport", "source_dir") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        outs = upload_bundle(open_transport(news["transport"]), news["source_dir"], news["code_root"])
        return UpdateResult(outs={**news, **outs})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        path = props.get("path")
        present = bool(path) and open_transport(props["transport"]).run(["test", "-d", path], timeout=60).ok
        return ReadResult(id_=id_, outs={**props, "content_hash": props.get("content_hash") if present else ""})

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Keeps the uploaded code: jobs that already ran or are queued may use it."""


class WorkloadBundle(DynamicResource):
    """The workload code on the Slurm machine; outputs content_hash, path (the versioned folder), current."""

    content_hash: pulumi.Output[str]
    path: pulumi.Output[str]
    current: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        source_dir: str,
        code_root: pulumi.Input[str],
        transport: pulumi.Input[dict],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(
            WorkloadBundleProvider(),
            name,
            {
                "source_dir": source_dir,
                "code_root": code_root,
                "transport": transport,
                "content_hash": bundle_hash(source_dir),
                "path": None,
                "current": None,
                "uploaded": None,
            },
            pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["transport"])),
        )
