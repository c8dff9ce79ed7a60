"""LocalTransport: atomic directory copy, commands with env/cwd/timeout, file reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.pipeline.transport import CommandFailed, CommandTimeout, LocalTransport, Transport, TransportError


def _tree(root: Path) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "a.txt").write_text("alpha\n")
    (root / "pkg" / "sub" / "b.sh").write_text("#!/bin/sh\necho b\n")
    (root / "pkg" / "sub" / "b.sh").chmod(0o755)
    (root / "pkg" / "link").symlink_to("a.txt")
    return root / "pkg"


def test_local_transport_is_a_transport() -> None:
    assert isinstance(LocalTransport(), Transport)


def test_put_directory_copies_tree_modes_and_links(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    dest = tmp_path / "remote" / "deep" / "code"
    LocalTransport().put_directory(src, str(dest))
    assert (dest / "a.txt").read_text() == "alpha\n"
    assert os.access(dest / "sub" / "b.sh", os.X_OK)
    assert os.readlink(dest / "link") == "a.txt"
    assert [p.name for p in dest.parent.iterdir()] == ["code"]


def test_put_directory_refuses_existing_target_unless_replace(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    dest = tmp_path / "code"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    t = LocalTransport()
    with pytest.raises(TransportError, match="already exists"):
        t.put_directory(src, str(dest))
    assert (dest / "old.txt").exists()
    t.put_directory(src, str(dest), replace=True)
    assert not (dest / "old.txt").exists()
    assert (dest / "a.txt").read_text() == "alpha\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["code", "src"]


def test_put_directory_failure_leaves_nothing_behind(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    os.mkfifo(src / "sub" / "fifo")
    dest = tmp_path / "out" / "code"
    with pytest.raises(Exception, match="fifo"):
        LocalTransport().put_directory(src, str(dest))
    assert not dest.exists()
    assert list((tmp_path / "out").iterdir()) == []


def test_run_returns_exit_code_and_streams_with_env_and_cwd(tmp_path: Path) -> None:
    r = LocalTransport().run("echo $GREETING; pwd; echo oops >&2; exit 3", env={"GREETING": "hi there"}, cwd=str(tmp_path))
    assert r.exit_code == 3 and not r.ok
    assert r.stdout.splitlines() == ["hi there", str(tmp_path)]
    assert r.stderr.strip() == "oops"
    with pytest.raises(CommandFailed, match="exited with code 3"):
        r.check()


def test_run_quotes_argv_lists() -> None:
    r = LocalTransport().run(["printf", "%s|", "a b", "$HOME", "it's"]).check()
    assert r.stdout == "a b|$HOME|it's|"


def test_run_timeout_kills_the_command(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(CommandTimeout, match="within 1s"):
        LocalTransport().run(f"echo $$ > {pid_file}; exec sleep 60", timeout=1)
    assert not alive(int(pid_file.read_text()))


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, already dead, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_run_rejects_bad_env_names() -> None:
    with pytest.raises(ValueError, match="invalid environment variable name"):
        LocalTransport().run("true", env={"BAD-NAME": "x"})


def test_read_file(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes("naïve\n".encode() + b"\xff")
    assert LocalTransport().read_file(str(tmp_path / "f.txt")).startswith("naïve\n")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        LocalTransport().read_file(str(tmp_path / "missing.txt"))
