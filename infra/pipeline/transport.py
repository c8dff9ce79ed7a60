"""How the pipeline reaches the machine that runs Slurm: the Transport protocol and LocalTransport.

A transport copies a directory atomically, runs a shell command with a timeout and reads a file.
`infra.pipeline.ssh.SshTransport` gives the same over SSH. Neither needs Pulumi.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from documents.atomic import replace_dir

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TransportError(RuntimeError):
    """A transport could not do what was asked (connection, copy, read)."""


class CommandTimeout(TransportError):
    """A command ran past its timeout and was stopped."""


class CommandFailed(TransportError):
    """A command exited non-zero where success was required."""

    def __init__(self, result: CommandResult) -> None:
        self.result = result
        detail = _tail(result.stderr or result.stdout, 20)
        super().__init__(f"command {result.command!r} exited with code {result.exit_code}" + (f":\n{detail}" if detail else ""))


@dataclass(frozen=True)
class CommandResult:
    """What a finished command returned."""

    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> CommandResult:
        """Return self, or raise CommandFailed when the exit code is not zero."""
        if not self.ok:
            raise CommandFailed(self)
        return self


@runtime_checkable
class Transport(Protocol):
    """The three things the pipeline needs from the machine that runs Slurm."""

    def put_directory(self, local_dir: str | Path, remote_dir: str, *, replace: bool = False) -> None:
        """Copy local_dir to remote_dir so that remote_dir appears complete or not at all."""

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        """Run a shell command (a string, or an argv list that is quoted) and return its result."""

    def read_file(self, path: str) -> str:
        """Return a text file's content (UTF-8; undecodable bytes replaced)."""

    def close(self) -> None:
        """Release the connection, if any (a later call connects again)."""


def shell_command(command: str | Sequence[str]) -> str:
    """A shell command line from a string (kept) or an argv sequence (quoted)."""
    return command if isinstance(command, str) else shlex.join(str(a) for a in command)


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """Validate environment variable names; values become strings."""
    clean: dict[str, str] = {}
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key):
            raise ValueError(f"invalid environment variable name {key!r}")
        clean[key] = str(value)
    return clean


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


class LocalTransport:
    """This machine: files are copied with shutil, commands run under bash."""

    def __repr__(self) -> str:
        return "LocalTransport()"

    def close(self) -> None:
        """Nothing to release."""

    def put_directory(self, local_dir: str | Path, remote_dir: str, *, replace: bool = False) -> None:
        source = Path(local_dir)
        if not source.is_dir():
            raise TransportError(f"local directory {source} does not exist")
        target = Path(remote_dir)
        if target.exists() and not replace:
            raise TransportError(f"{target} already exists (pass replace=True to swap it)")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:12]}"
        try:
            shutil.copytree(source, staging, symlinks=True)
            replace_dir(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        line = shell_command(command)
        proc = subprocess.Popen(
            ["bash", "-c", line],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **check_env(env)},
            cwd=cwd,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise CommandTimeout(f"command {line!r} did not finish within {timeout:g}s and was killed") from None
        return CommandResult(line, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    def read_file(self, path: str) -> str:
        try:
            return Path(path).read_bytes().decode(errors="replace")
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} does not exist on this machine") from None
