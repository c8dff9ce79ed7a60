"""Run the serving launcher (`python -m workloads.serve.launcher.launch`) as a child process: start it on free
loopback ports, wait until /health answers, and stop it the way Slurm does (SIGTERM to its group)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx


ENGINE_PORTS = 2
"""ports a launcher's engines take from its --backend-port on: two for the transformers engines (fine-tuned, then
base), one for the peft or the vLLM engine (workloads/serve/launcher/engine_plan.py)"""
LOCAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PICKED_PORTS = (20_000, 29_000)
"""where free_port picks: below the ephemeral range and clear of the fixed ports the suite's daemons and jobs use
(the local Prometheus 19090 and node exporter 19100, torchrun's 29400 and 29500, Slurm's 6817-6818 and 6990)"""


def free_port(count: int = 1) -> int:
    """The first of `count` consecutive TCP ports on 127.0.0.1 that nothing holds right now, below the kernel's
    ephemeral range: a port from that range (bind to port 0) can be taken by any client connection's local end
    between this check and the server's bind, and the ports after it were never checked (a launcher's second engine
    once found its port, --backend-port + 1, taken: "address already in use"). Two tests picking at once could
    still pick one block: one in about 9,000."""
    low = int(LOCAL_PORT_RANGE.read_text().split()[0]) if LOCAL_PORT_RANGE.is_file() else 32768
    while True:
        first = random.randrange(PICKED_PORTS[0], min(PICKED_PORTS[1], low) - count)
        if all(_bindable(port) for port in range(first, first + count)):
            return first


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def start_launcher(config: Path, args: Sequence[str], env: Mapping[str, str], log: Path, timeout_s: float,
                   cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start the launcher for `config` on a free port; return it and its base URL once /health is 200.
    A launcher that exits or stays unhealthy is stopped and reported with the tail of `log`."""
    port = free_port()
    argv = [sys.executable, "-m", "workloads.serve.launcher.launch", "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--backend-port", str(free_port(ENGINE_PORTS)), *args]
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
