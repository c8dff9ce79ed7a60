"""Atomic outputs and manifests: build beside the target, rename into place, record what went in."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextmanager
def atomic_file(target: str | os.PathLike[str], mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path beside `target`; on success it replaces `target` (with permissions `mode`),
    on error it is removed. The one atomic writer: every file the project publishes goes through it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as error:
        raise OSError(error.errno, error.strerror, str(target)) from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, mode)
        try:
            os.replace(tmp, target)
        except OSError as error:
            raise OSError(error.errno, error.strerror, str(target)) from None
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary folder beside `target`; on success it takes the place of `target`."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as error:
        raise OSError(error.errno, error.strerror, str(target)) from None
    try:
        yield tmp
        _make_readable(tmp)
        replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def os_errors_as(error_type: type[Exception], path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an OSError (full disk, read-only folder) into `error_type` with one line: the path the OS names,
    else `path` (the output being written), and the cause."""
    try:
        yield
    except OSError as error:
        raise error_type(f"{error.filename or path}: {error.strerror or error}") from None


def _make_readable(folder: Path) -> None:
    """Temporary files and folders start private; published outputs are readable by the team."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else path.stat().st_mode | 0o644)


def replace_dir(source: Path, target: Path) -> None:
    """Rename folder `source` to `target`, moving an existing `target` aside first and deleting it after."""
    if not target.exists():
        os.replace(source, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    os.replace(target, old / target.name)
    os.replace(source, target)
    shutil.rmtree(old, ignore_errors=True)


def write_text_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> None:
    with atomic_file(path, mode) as tmp:
        tmp.write_text(text, encoding="utf-8")
