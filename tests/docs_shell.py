"""Running a page's command blocks as a new user types them: one new shell, no venv or Slurm variables of the tests,
from the repository root (tests/test_docs_commands.py, and the README's rehearsal-cluster run that the cluster
pipeline tests read, tests/documented_cluster_run.py)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from docs_blocks import ROOT, Block, read_blocks

SET_BY_TESTS = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "SLURM_CONF", "FT_", "SLURM_", "PYTEST_", "HF_",
                "LOCAL_CLUSTER_", "FTSTACK_", "PULUMI_")


def new_shell_env() -> dict[str, str]:
    """This machine's environment as a new login shell has it (its certificates and package mirrors included),
    less what a test, pytest or an activated venv set: the venv off PATH, no SLURM_CONF, VIRTUAL_ENV, PYTHONPATH,
    FT_*. The workers' one-thread cap (tests/conftest.py) stays: it is not the reader's, but keeps the suite's CPU
    where it was."""
    venv_bin = Path(sys.executable).parent.resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith(SET_BY_TESTS)}
    env["PATH"] = ":".join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(":")
                           if p and Path(p).resolve() != venv_bin)
    return env


def server_address(block: Block) -> tuple[str, str]:
    """The loopback address a server block's comment names (`# 127.0.0.1:8000`)."""
    found = re.findall(r"(127\.0\.0\.1):(\d+)", block.text.split(" # ", 1)[-1] if " # " in block.text else "")
    assert found, f"{block.where}: a block that runs until stopped names no 127.0.0.1:PORT in its comment"
    return found[-1]


def server_script(block: Block) -> str:
    """Start the server block in a session of its own and wait until its address accepts a connection (failing if
    it exits first, or if the address is taken before it starts). It keeps running, as in the reader's other
    terminal, for the page's later blocks (the chat UI needs the server); the page's end stops it (SIGTERM)."""
    host, port = server_address(block)
    probe = f"(exec 3<>/dev/tcp/{host}/{port}) 2>/dev/null"
    return (f"if {probe}; then echo '{host}:{port} is taken before {block.where} starts' >&2; exit 1; fi\n"
            f"setsid bash -c {shlex.quote(block.text)} &\nservers=\"$! $servers\"\n"
            f"for _ in $(seq 900); do {probe} && break; "
            f"kill -0 $! 2>/dev/null || {{ echo '{block.where} exited before listening' >&2; exit 1; }}; "
            f"sleep 1; done\n"
            f"{probe} || {{ echo '{block.where}: nothing on {host}:{port}' >&2; exit 1; }}\n")


STOP_SERVERS = "for s in $servers; do kill -TERM -- -$s 2>/dev/null; done; wait"


def run_in_new_shell(blocks: list[Block], timeout: float) -> subprocess.CompletedProcess[str]:
    """The blocks one after another in one `bash`, from the repository root; stops at the first failing command
    (each block's start is echoed to standard error, so a failure names its block). A server block is started and
    reached (`server_script`); the servers stop when the page ends."""
    script = f"set -eo pipefail\nservers=''\ntrap {shlex.quote(STOP_SERVERS)} EXIT\n" + "".join(
        f"echo '>>> {b.where}' >&2\n" + (server_script(b) if b.need == "server" else f"{b.text}\n") for b in blocks)
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=new_shell_env(), capture_output=True, text=True,
                          timeout=timeout)


def assert_ran(proc: subprocess.CompletedProcess[str], what: str) -> None:
    started = re.findall(r"^>>> (\S+)$", proc.stderr, re.MULTILINE)
    assert proc.returncode == 0, (f"{what}: block {started[-1] if started else '?'} failed with exit code "
                                  f"{proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-4000:]}")


def page_blocks(page: Path, cluster: bool) -> list[Block]:
    """The blocks a page runs here, in its order: unmarked ones and servers; those on the rehearsal cluster or
    the others."""
    return [b for b in read_blocks(page) if (b.runs or b.need == "server") and b.on_rehearsal_cluster == cluster]
