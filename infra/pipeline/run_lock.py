"""One `ftstack run` per stack at a time: an exclusive lock file beside the stack's pipeline state.

The lock is an fcntl lock on `.local/pipeline/<stack>.lock`, held for the whole run (submission and, with
--wait, the wait). The kernel drops it when the process ends, however it ends, so a crashed run never leaves
a stale lock. The file's text says who holds it, for the message a second run prints.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path


class StackBusy(RuntimeError):
    """Another process holds the stack's pipeline lock; the message names it."""


def lock_path(state_file: Path) -> Path:
    return state_file.with_suffix(".lock")


def holder_line(command: list[str] | None = None) -> str:
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    argv = " ".join(command or ["ftstack", *sys.argv[1:]])
    return f"pid {os.getpid()} on {socket.gethostname()} since {started}: {argv}\n"


@contextmanager
def stack_lock(state_file: Path, stack_name: str) -> Iterator[None]:
    """Hold the stack's lock for the block; raise StackBusy naming the holder when another process has it."""
    path = lock_path(state_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text(encoding="utf-8", errors="replace").strip() or "another process"
            raise StackBusy(f"stack {stack_name!r} is being run by {holder} (lock {path}); wait for it to end, "
                            f"or follow it with `ftstack status --stack {stack_name}`") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_line().encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
