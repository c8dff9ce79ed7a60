"""An adapter's files read without following a symbolic link, hashed and loaded as the bytes read (issue 64 item 1).

A stored run is walked from the run store's folder one name at a time (`os.open` with O_NOFOLLOW relative to the
folder before, `dir_fd`), so that no link on the way, in the run or at the file is followed; a link anywhere in
the stored run (a file or a folder) refuses the run unread. The bytes read are what is hashed and what the engine
loads: the CPU engine from a private copy it removes once loaded, vLLM (which reads a folder itself, whenever its
adapter cache takes the adapter in again) from a private copy for as long as the launcher runs (`private_copy`).
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from documents.adapter_registry import ADAPTER_FILES, AdapterEntry, adapter_digest
from documents.run_store import ADAPTER_DIR, run_key

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class AdapterFileError(ValueError):
    """An adapter file that may not be read: a link on the way, a missing or special file."""


@dataclass(frozen=True)
class AdapterFiles:
    """The bytes of an adapter's files (documents.adapter_registry.ADAPTER_FILES), read from `folder`."""

    folder: Path
    contents: dict[str, bytes]

    @property
    def sha256(self) -> str:
        return adapter_digest(lambda name: io.BytesIO(self.contents[name]))


def _refusal(error: OSError, shown: Path, parent: int, name: str) -> AdapterFileError:
    try:
        link = stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        link = False
    if link or error.errno == errno.ELOOP:
        return AdapterFileError(f"{shown} is a symbolic link, which may lead outside the folder it lies in: "
                                "refused unread")
    return AdapterFileError(f"{shown}: {error.strerror}")


@contextmanager
def opened_folder(root: Path, parts: tuple[str, ...]) -> Iterator[int]:
    """A descriptor of root/parts..., each of `parts` opened from the one before without following a link."""
    with ExitStack() as held:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        held.callback(os.close, fd)
        for depth, name in enumerate(parts):
            fd = held.enter_context(opened_folder_at(fd, name, root.joinpath(*parts[:depth + 1])))
        yield fd


def _read(folder_fd: int, name: str, shown: Path) -> bytes:
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=folder_fd)
    except OSError as error:
        raise _refusal(error, shown, folder_fd, name) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise AdapterFileError(f"{shown} is not a regular file: refused")
        return handle.read()


def _files_in(folder_fd: int, folder: Path) -> AdapterFiles:
    """The adapter files of `folder`, open as `folder_fd`, each read without following a link."""
    return AdapterFiles(folder, {name: _read(folder_fd, name, folder / name) for name in ADAPTER_FILES})


def read_adapter(folder: Path) -> AdapterFiles:
    """The adapter files of `folder` (no link followed below it)."""
    try:
        with opened_folder(folder, ()) as fd:
            return _files_in(fd, folder)
    except FileNotFoundError as error:
        raise AdapterFileError(f"{folder}: {error.strerror}") from None


def links_in(folder_fd: int, shown: Path) -> list[Path]:
    """Every symbolic link in the folder open as `folder_fd`, its subfolders walked without following one."""
    found = []
    for entry in os.scandir(folder_fd):
        if entry.is_symlink():
            found.append(shown / entry.name)
        elif entry.is_dir(follow_symlinks=False):
            with opened_folder_at(folder_fd, entry.name, shown / entry.name) as inner:
                found.extend(links_in(inner, shown / entry.name))
    return found


@contextmanager
def opened_folder_at(parent: int, name: str, shown: Path) -> Iterator[int]:
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        raise _refusal(error, shown, parent, name) from None
    try:
        yield fd
    finally:
        os.close(fd)


def read_stored_adapter(store_dir: Path, stack_name: str, run_id: str) -> AdapterFiles:
    """The adapter files of a stored run, the run refused when any link lies in it (its folders walked from
    `store_dir` without following one)."""
    parts = Path(run_key(stack_name, run_id)).parts
    run_dir = store_dir.joinpath(*parts)
    try:
        with opened_folder(store_dir, parts) as run_fd:
            if links := links_in(run_fd, run_dir):
                raise AdapterFileError(f"{links[0]} is a symbolic link, which may lead outside the run store "
                                       f"({store_dir}; {len(links)} link(s) in the stored run): refused unread")
            with opened_folder_at(run_fd, ADAPTER_DIR, run_dir / ADAPTER_DIR) as fd:
                return _files_in(fd, run_dir / ADAPTER_DIR)
    except FileNotFoundError as error:
        raise AdapterFileError(f"{run_dir}: {error.strerror}") from None


def write_copy(files: AdapterFiles, folder: Path) -> Path:
    """The files written into a new folder `folder` (its parent exists), mode 0700."""
    folder.mkdir(mode=0o700)
    for name, data in files.contents.items():
        (folder / name).write_bytes(data)
    return folder


def private_copy(files: AdapterFiles, under: Path) -> Path:
    """A copy of `files` in `under` (the launcher's private work folder), named by their hash: the folder an
    engine that reads a path is given; written to a temporary folder and renamed, so that it is whole or absent."""
    target = under / f"adapter-{files.sha256[:32]}"
    if target.is_dir():
        return target
    staging = write_copy(files, Path(tempfile.mkdtemp(dir=under, prefix=".staging-")) / "adapter")
    try:
        staging.rename(target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(staging.parent, ignore_errors=True)
    return target


def read_entry(entry: AdapterEntry) -> AdapterFiles:
    """A served entry's files: a stored run's walked from its store (no link in the run), the run's own read in
    its folder."""
    folder = Path(entry.adapter_dir)
    stored = (*Path(run_key(entry.stack, entry.run_id)).parts, ADAPTER_DIR) if entry.stack else None
    if stored and folder.parts[-len(stored):] == stored:
        return read_stored_adapter(folder.parents[len(stored) - 1], entry.stack, entry.run_id)
    return read_adapter(folder)


def engine_copy(entry: AdapterEntry, under: Path) -> str:
    """The folder a path-reading engine (vLLM) is given for `entry`: a private copy of the files read, when they
    still hash to the entry's `adapter_sha256` (AdapterFileError otherwise)."""
    files = read_entry(entry)
    if entry.adapter_sha256 is not None and files.sha256 != entry.adapter_sha256:
        raise AdapterFileError(f"adapter {entry.name!r}: the files in {entry.adapter_dir} hash to "
                               f"{files.sha256[:16]}, the registry recorded {entry.adapter_sha256[:16]}: refused")
    return str(private_copy(files, under))
