"""SshTransport against a real sshd on loopback (tests/sshd_fixtures.py)."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import pytest

from infra.pipeline import ssh
from infra.pipeline.ssh import (
    HostKeyMismatch,
    SshAuthError,
    SshConnectError,
    SshTransport,
    UnknownHostKey,
    parse_public_key,
)
from infra.pipeline.transport import CommandTimeout, Transport, TransportError
from sshd_fixtures import SshServer, free_port
from test_transport_local import alive


def _transport(server: SshServer, tmp_path: Path, **kw) -> SshTransport:
    kw.setdefault("known_hosts", tmp_path / "known_hosts")
    kw.setdefault("private_key", server.private_key)
    return SshTransport(server.host, port=server.port, user=server.user, attempts=2, backoff_s=0.05, **kw)


def test_pinned_host_key_runs_commands_with_env_cwd(sshd: SshServer, tmp_path: Path) -> None:
    with _transport(sshd, tmp_path, host_key=sshd.host_public_key) as t:
        assert isinstance(t, Transport)
        r = t.run("echo $A; pwd; echo err >&2; exit 4", env={"A": "x y;$z"}, cwd=str(tmp_path))
        assert (r.exit_code, r.stdout.splitlines(), r.stderr.strip()) == (4, ["x y;$z", str(tmp_path)], "err")
        assert t.run(["printf", "%s|", "a b", "it's"]).check().stdout == "a b|it's|"
    assert not (tmp_path / "known_hosts").exists()


def test_wrong_pinned_host_key_is_refused(sshd: SshServer, tmp_path: Path) -> None:
    t = _transport(sshd, tmp_path, host_key=sshd.other_host_public_key)
    with pytest.raises(HostKeyMismatch, match="refusing to connect") as err:
        t.run("true")
    assert parse_public_key(sshd.other_host_public_key).fingerprint in str(err.value)


def test_trust_on_first_use_records_then_enforces(sshd: SshServer, tmp_path: Path) -> None:
    known = tmp_path / "kh" / "known_hosts"
    with _transport(sshd, tmp_path, known_hosts=known) as t:
        assert t.run("echo ok").check().stdout == "ok\n"
    line = known.read_text().split()
    assert line[0] == f"[127.0.0.1]:{sshd.port}"
    assert parse_public_key(" ".join(line)) == parse_public_key(sshd.host_public_key)
    with _transport(sshd, tmp_path, known_hosts=known) as t:
        assert t.run("echo again").check().stdout == "again\n"
    other = parse_public_key(sshd.other_host_public_key)
    known.write_text(f"[127.0.0.1]:{sshd.port} {other.get_name()} {other.get_base64()}\n")
    with pytest.raises(HostKeyMismatch, match="records"):
        _transport(sshd, tmp_path, known_hosts=known).run("true")


def test_unknown_host_without_tofu_is_refused(sshd: SshServer, tmp_path: Path) -> None:
    with pytest.raises(UnknownHostKey, match="not in"):
        _transport(sshd, tmp_path, trust_on_first_use=False).run("true")
    assert not (tmp_path / "known_hosts").exists()


def test_wrong_user_key_fails_auth_clearly(sshd: SshServer, tmp_path: Path) -> None:
    t = _transport(sshd, tmp_path, private_key=sshd.other_private_key, host_key=sshd.host_public_key)
    with pytest.raises(SshAuthError, match="refused the key SHA256:"):
        t.run("true")


def test_unparseable_private_key_is_a_clear_error() -> None:
    with pytest.raises(TransportError, match="could not be parsed"):
        SshTransport("127.0.0.1", private_key="not a key")


def test_closed_port_fails_after_bounded_retries(tmp_path: Path, sshd: SshServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    t = SshTransport("127.0.0.1", port=port, private_key=sshd.private_key, known_hosts=tmp_path / "kh", attempts=4,
                     backoff_s=0.1, max_backoff_s=0.25)
    waits: list[float] = []
    monkeypatch.setattr(ssh.time, "sleep", waits.append)
    with pytest.raises(SshConnectError, match="after 4 attempts") as err:
        t.run("true")
    assert "refused" in str(err.value).lower()
    assert waits == [0.1, 0.2, 0.25], "exponential backoff between attempts, capped"


def test_unresolvable_host_is_a_clear_error(sshd: SshServer) -> None:
    t = SshTransport("no-such-host.invalid", private_key=sshd.private_key, attempts=3)
    with pytest.raises(SshConnectError, match="cannot resolve"):
        t.run("true")


def test_put_directory_is_atomic_and_read_file(sshd: SshServer, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "jobs").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "jobs" / "run.sbatch").write_text("#!/bin/bash\necho hi\n")
    (src / "jobs" / "run.sbatch").chmod(0o750)
    (src / "current").symlink_to("a.txt")
    remote = tmp_path / "remote" / "code" / "abc123"
    with _transport(sshd, tmp_path, host_key=sshd.host_public_key) as t:
        t.put_directory(src, str(remote))
        assert t.read_file(str(remote / "a.txt")) == "alpha\n"
        assert (remote / "jobs" / "run.sbatch").stat().st_mode & 0o777 == 0o750
        assert os.readlink(remote / "current") == "a.txt"
        assert sorted(p.name for p in remote.parent.iterdir()) == ["abc123"]
        with pytest.raises(TransportError, match="already exists"):
            t.put_directory(src, str(remote))
        (src / "a.txt").write_text("beta\n")
        t.put_directory(src, str(remote), replace=True)
        assert t.read_file(str(remote / "a.txt")) == "beta\n"
        assert sorted(p.name for p in remote.parent.iterdir()) == ["abc123"]
        with pytest.raises(FileNotFoundError, match="nope.txt"):
            t.read_file(str(remote / "nope.txt"))


def test_put_directory_failure_leaves_no_partial_target(sshd: SshServer, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.txt").write_text("ok")
    os.mkfifo(src / "pipe")
    remote = tmp_path / "remote" / "code"
    with _transport(sshd, tmp_path, host_key=sshd.host_public_key) as t:
        with pytest.raises(Exception):
            t.put_directory(src, str(remote))
    assert not remote.exists()
    assert list((tmp_path / "remote").iterdir()) == []


def test_run_timeout_is_a_clear_error_and_kills_the_command(sshd: SshServer, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with _transport(sshd, tmp_path, host_key=sshd.host_public_key) as t:
        with pytest.raises(CommandTimeout, match="within 1s"):
            t.run(f"echo $$ > {pid_file}; exec sleep 60", timeout=1)
        assert t.run("echo still usable", timeout=10).check().stdout == "still usable\n"
    pid = int(pid_file.read_text())
    for _ in range(100):  # sshd tears the session down after the client closed the channel
        if not alive(pid):
            break
        time.sleep(0.1)
    assert not alive(pid), f"remote command (pid {pid}) still runs after the timeout"


def test_transport_refuses_pickling_and_hides_key(sshd: SshServer, tmp_path: Path) -> None:
    t = _transport(sshd, tmp_path)
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(t)
    assert "PRIVATE" not in repr(t) and sshd.private_key not in repr(vars(t))



def test_run_returns_every_byte_of_the_output_when_the_exit_status_comes_first(sshd: SshServer, tmp_path: Path) -> None:
    """sshd may send the exit status while output is still on its way (a fetched 52 kB chart once came back as its
    first 32 KiB): the result holds every byte of stdout and stderr."""
    with _transport(sshd, tmp_path, host_key=sshd.host_public_key) as t:
        size = 52_000
        for _ in range(40):
            result = t.run(f"head -c {size} /dev/zero | tr '\\0' x; echo done >&2").check()
            assert (len(result.stdout), result.stdout.count("x"), result.stderr) == (size, size, "done\n")
