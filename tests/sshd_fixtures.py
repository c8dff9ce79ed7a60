"""A real OpenSSH server on loopback for the SSH transport tests (pytest plugin).

Per test session: fresh host and user key pairs (ssh-keygen), an sshd_config of its own on a free
127.0.0.1 port, `/usr/sbin/sshd -D -e -f CONFIG` as a child process, stopped at teardown.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")


@dataclass(frozen=True)
class SshServer:
    host: str
    port: int
    user: str
    private_key: str
    host_public_key: str
    other_private_key: str
    other_host_public_key: str
    home: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(path)], check=True)


def _wait_for_banner(port: int, proc: subprocess.Popen, log: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with code {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sshd did not answer on 127.0.0.1:{port} within {timeout:g}s:\n{log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A running sshd on 127.0.0.1 that accepts `private_key` for the current user."""
    if not SSHD.exists():
        pytest.fail(f"{SSHD} is missing: install openssh-server (scripts/system-deps.sh)")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    home = tmp_path_factory.mktemp("sshd")
    for name in ("host", "other_host", "user", "other_user"):
        _keygen(home / name)
    (home / "authorized_keys").write_text((home / "user.pub").read_text())
    port = free_port()
    config = home / "sshd_config"
    config.write_text(
        "\n".join(
            [
                "ListenAddress 127.0.0.1",
                f"Port {port}",
                f"HostKey {home / 'host'}",
                f"PidFile {home / 'sshd.pid'}",
                f"AuthorizedKeysFile {home / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "StrictModes no",
                "UsePAM no",
                "Subsystem sftp internal-sftp",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    log = home / "sshd.log"
    with log.open("w") as log_fh:
        proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log_fh, stderr=subprocess.STDOUT)
    try:
        _wait_for_banner(port, proc, log)
        yield SshServer(
            host="127.0.0.1",
            port=port,
            user=getpass.getuser(),
            private_key=(home / "user").read_text(),
            host_public_key=(home / "host.pub").read_text().strip(),
            other_private_key=(home / "other_user").read_text(),
            other_host_public_key=(home / "other_host.pub").read_text().strip(),
            home=home,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
