"""Run the serving launcher (`python -m workloads.serve.launcher.launch`) as a child process: start it on free
loopback ports, wait until /health answers, and stop it the way Slurm does (SIGTERM to its group)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_launcher(config: Path, args: Sequence[str], env: Mapping[str, str], log: Path, timeout_s: float,
                   cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start the launcher for `config` on a free port; return it and its base URL once /health is 200.
    A launcher that exits or stays unhealthy is stopped and reported with the tail of `log`."""
    port = free_port()
    argv = [sys.executable, "-m", "workloads.serve.launcher.launch", "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--backend-port", str(free_port()), *args]
    proc = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}; {log}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_launcher(proc)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f}s; {log}:\n{log.read_text()[-3000:]}")


def stop_launcher(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the launcher's process group, then SIGKILL it if it is still there after `grace_s`."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
