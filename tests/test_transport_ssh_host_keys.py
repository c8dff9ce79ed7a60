"""SshTransport's host-key rules against a real sshd that offers both an ed25519 and an ECDSA host key:
pinning either type, known_hosts kept as the user wrote it (append only, mode kept, comments and markers),
a stack that requires a pinned key, a passphrase-protected client key."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sshd_fixtures import SSHD, _wait_for_banner, free_port

from infra.config import PipelineConfig
from infra.pipeline.ssh import HostKeyMismatch, SshTransport, UnknownHostKey, parse_public_key
from infra.pipeline.transport import TransportError

PASSPHRASE = "correct horse battery"


@dataclass(frozen=True)
class TwoKeyServer:
    port: int
    user: str
    private_key: str
    encrypted_private_key: str
    ed25519: str
    ecdsa: str

    @property
    def entry(self) -> str:
        return f"[127.0.0.1]:{self.port}"


def _keygen(path: Path, kind: str, passphrase: str = "") -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", "test", "-f", str(path)], check=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoKeyServer]:
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    home = tmp_path_factory.mktemp("sshd2")
    _keygen(home / "host_ed25519", "ed25519")
    _keygen(home / "host_ecdsa", "ecdsa")
    _keygen(home / "user", "ed25519")
    _keygen(home / "user_enc", "ecdsa", PASSPHRASE)
    (home / "authorized_keys").write_text((home / "user.pub").read_text() + (home / "user_enc.pub").read_text())
    port = free_port()
    config = home / "sshd_config"
    config.write_text("\n".join([
        "ListenAddress 127.0.0.1", f"Port {port}", f"HostKey {home / 'host_ed25519'}", f"HostKey {home / 'host_ecdsa'}",
        f"PidFile {home / 'sshd.pid'}", f"AuthorizedKeysFile {home / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "StrictModes no", "UsePAM no", "Subsystem sftp internal-sftp", "",
    ]))
    log = home / "sshd.log"
    with log.open("w") as handle:
        proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=handle, stderr=subprocess.STDOUT)
    try:
        _wait_for_banner(port, proc, log)
        yield TwoKeyServer(port, os.environ.get("USER") or "root", (home / "user").read_text(),
                           (home / "user_enc").read_text(), (home / "host_ed25519.pub").read_text().strip(),
                           (home / "host_ecdsa.pub").read_text().strip())
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _transport(server: TwoKeyServer, known_hosts: Path, **kw) -> SshTransport:
    kw.setdefault("private_key", server.private_key)
    import getpass

    return SshTransport("127.0.0.1", port=server.port, user=getpass.getuser(), known_hosts=known_hosts, attempts=1, **kw)


@pytest.mark.parametrize("kind", ["ecdsa", "ed25519"])
def test_pinning_either_host_key_of_the_server_connects(server: TwoKeyServer, tmp_path: Path, kind: str) -> None:
    with _transport(server, tmp_path / "kh", host_key=getattr(server, kind)) as t:
        assert t.run("echo ok").check().stdout == "ok\n"


def test_recorded_ecdsa_key_is_the_one_asked_for(server: TwoKeyServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    ecdsa = parse_public_key(server.ecdsa)
    known.write_text(f"{server.entry} {ecdsa.get_name()} {ecdsa.get_base64()}\n")
    with _transport(server, known) as t:
        assert t.run("echo ok").check().stdout == "ok\n"
    assert known.read_text() == f"{server.entry} {ecdsa.get_name()} {ecdsa.get_base64()}\n"


def _markers(server: TwoKeyServer) -> str:
    """Lines this transport does not use, all to be kept: a comment, markers, junk, another host."""
    body = server.ed25519.split()[1]
    return (f"# team hosts, keep this comment\n@cert-authority *.bank.internal ssh-ed25519 {body}\n"
            f"@revoked old-login ssh-ed25519 {body}\nthis line is not a known_hosts entry\n"
            f"broken-host ssh-ed25519 AAAA-not-base64\nother-host ssh-ed25519 {body}\n")


def test_first_use_appends_keeps_mode_comments_and_markers(server: TwoKeyServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    markers = _markers(server)
    known.write_text(markers.rstrip("\n"))
    known.chmod(0o600)
    with _transport(server, known) as t:
        assert t.run("echo ok").check().stdout == "ok\n"
    text = known.read_text()
    assert text.startswith(markers), text
    added = text[len(markers):].splitlines()
    assert len(added) == 1 and added[0].startswith(f"{server.entry} "), text
    assert parse_public_key(added[0]) in (parse_public_key(server.ed25519), parse_public_key(server.ecdsa))
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    with _transport(server, known) as t:
        assert t.run("echo again").check().stdout == "again\n"
    assert known.read_text() == text


def test_new_known_hosts_file_is_private(server: TwoKeyServer, tmp_path: Path) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    with _transport(server, known) as t:
        t.run("true").check()
    assert stat.S_IMODE(known.stat().st_mode) == 0o600


def test_revoked_host_key_is_refused(server: TwoKeyServer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    lines = [f"@revoked {server.entry} {key}" for key in (server.ed25519, server.ecdsa)]
    known.write_text("\n".join(lines) + "\n")
    with pytest.raises(HostKeyMismatch, match="revoked"):
        _transport(server, known).run("true")


def test_required_pin_refuses_trust_on_first_use(server: TwoKeyServer, tmp_path: Path) -> None:
    with pytest.raises(UnknownHostKey, match="pinned"):
        _transport(server, tmp_path / "kh", require_pinned=True).run("true")
    assert not (tmp_path / "kh").exists()
    with pytest.raises(ValueError, match="loginHostKey"):
        PipelineConfig(run_config="workloads/configs/local.json", require_pinned_host_key=True)
    assert PipelineConfig(run_config="workloads/configs/local.json", require_pinned_host_key=True,
                          login_host_key=server.ecdsa).require_pinned_host_key


def test_passphrase_protected_key(server: TwoKeyServer, tmp_path: Path) -> None:
    with _transport(server, tmp_path / "kh", private_key=server.encrypted_private_key, passphrase=PASSPHRASE,
                    host_key=server.ecdsa) as t:
        assert t.run("echo ok").check().stdout == "ok\n"
    with pytest.raises(TransportError, match="passphrase"):
        _transport(server, tmp_path / "kh", private_key=server.encrypted_private_key, passphrase="wrong")
