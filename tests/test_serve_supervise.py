"""The engine supervisor ends an engine's whole process group, whatever became of its leader (issue 64, item 2).

The probe: SIGKILL of the vLLM server process left its `VLLM::EngineCore` and `VLLM::Worker` (2.3 GB resident)
alive with ppid 1, through the launcher's restart and after its SIGTERM, since `stop_processes` signalled the
group only while the leader lived. Here a real engine process that forks a worker, as vLLM's server does
(tests/test_serve_vllm.py kills the real vLLM's leader); the CPU engine forks none. The test waits for events (the
restarted engine healthy, the supervisor stopped), never on a clock."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from serve_process import free_port
from workloads.serve.launcher.engine_plan import EnginePlan
from workloads.serve.launcher.supervise import Supervisor, group_members

ENGINE = '''
import http.server, os, signal, sys

port, pids = int(sys.argv[1]), sys.argv[2]
worker = os.fork()
if worker == 0:  # the engine's worker: runs until signalled, like vLLM's EngineCore
    while True:
        signal.pause()
with open(pids, "a") as handle:
    handle.write(f"{os.getpid()} {worker}\\n")


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def alive(pid: int) -> bool:
    """Running, not a zombie left for its new parent to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def engine(tmp_path: Path) -> tuple[EnginePlan, Path]:
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    pids = tmp_path / "pids"
    port = free_port()
    return EnginePlan("forking", [sys.executable, str(script), str(port), str(pids)], port), pids


def started(pids: Path) -> list[tuple[int, int]]:
    return [tuple(map(int, line.split())) for line in pids.read_text().splitlines()]


def test_a_killed_leaders_worker_is_ended_before_the_restart_and_at_stop(engine) -> None:
    """`kill -9 <engine leader>`: its worker (ppid 1 now) is ended before the engine starts again; at stop, the
    second engine's worker is ended too, its leader killed first."""
    plan, pids = engine
    restarted, gave_up = threading.Event(), []
    supervisor = Supervisor([plan], dict(os.environ), startup_timeout_s=120, max_restarts=2, stop_grace_s=10,
                            on_give_up=gave_up.append, on_restarted=lambda plan: restarted.set())
    supervisor.start()
    try:
        ((leader, worker),) = started(pids)
        assert group_members(leader) == sorted([leader, worker])
        os.kill(leader, signal.SIGKILL)
        assert restarted.wait(300), gave_up
        assert not alive(worker) and group_members(leader) == []
        (_, (leader, worker)) = started(pids)
        assert alive(worker)
        os.kill(leader, signal.SIGKILL)
    finally:
        supervisor.stop()
    assert not alive(worker) and group_members(leader) == [] and not gave_up
