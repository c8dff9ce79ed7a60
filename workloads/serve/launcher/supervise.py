"""Engine processes under supervision: started in their own process groups, watched, restarted with backoff
when they exit or their continuous-batching worker dies, and stopped within a bound (SIGTERM, then SIGKILL).

When an engine fails once more than `max_restarts` allows, the supervisor gives up and calls `on_give_up`,
which ends the launcher with a non-zero status so that Slurm records the serve job as failed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

from workloads.serve.launcher.engine_plan import EnginePlan

POLL_S = 2.0
MAX_BACKOFF_S = 30.0


class EngineError(RuntimeError):
    """An engine process exited or did not become healthy in time."""


def log(message: str) -> None:
    print(f"serve: {message}", file=sys.stderr, flush=True)


def probe(url: str) -> int | None:
    """The status of the engine's /health (503 once its batching worker died), None when it does not answer."""
    try:
        return httpx.get(f"{url}/health", timeout=5.0).status_code
    except httpx.HTTPError:
        return None


GONE_POLL_S = 0.05


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies aside) of process group `pgid`, wherever their parent went: an engine's
    workers (vLLM's EngineCore and Worker) outlive a killed leader with ppid 1, in its group."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:  # nothing left of the group
        pass


def wait_gone(proc: subprocess.Popen, deadline: float) -> bool:
    """Reap the leader and wait until its group is empty or `deadline` passes; whether the group is gone."""
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    while group_members(proc.pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(GONE_POLL_S)
    return True


def stop_processes(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM every engine's process group, whatever became of its leader (a leader killed leaves its workers
    in the group), wait `grace_s` in all for the groups to empty, then SIGKILL what is left of each and wait
    (`grace_s` again at most) until it is gone, the leader reaped."""
    for proc in procs:
        signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        if not wait_gone(proc, deadline):
            signal_group(proc.pid, signal.SIGKILL)
            if not wait_gone(proc, time.monotonic() + grace_s):
                log(f"engine process group {proc.pid} still has {group_members(proc.pid)} after SIGKILL")


class Supervisor:
    """The engines of one launcher. `state(url)` is None while healthy, else "restarting" or "failed"."""

    def __init__(self, plans: list[EnginePlan], env: Mapping[str, str], startup_timeout_s: float, max_restarts: int,
                 stop_grace_s: float, on_give_up: Callable[[str], None],
                 on_restarted: Callable[[EnginePlan], None] = lambda plan: None) -> None:
        """`on_restarted(plan)` runs once a restarted engine is healthy, before its state clears (the served
        set is loaded back into it meanwhile); when it raises httpx.HTTPError the engine counts as failed again."""
        self.plans, self.env = plans, dict(env)
        self.startup_timeout_s, self.max_restarts, self.stop_grace_s = startup_timeout_s, max_restarts, stop_grace_s
        self.on_give_up, self.on_restarted = on_give_up, on_restarted
        self.procs: list[subprocess.Popen] = []
        self.restarts = [0] * len(plans)
        self.states: dict[str, str] = {}
        self.stopping = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="engine-supervisor", daemon=True)

    def _spawn(self, plan: EnginePlan) -> subprocess.Popen:
        return subprocess.Popen(plan.argv, env={**self.env, **plan.env}, start_new_session=True, stdout=sys.stderr)

    def _wait_healthy(self, indexes: list[int]) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        pending = list(indexes)
        while pending and not self.stopping.is_set():
            for i in list(pending):
                plan, proc = self.plans[i], self.procs[i]
                if proc.poll() is not None:
                    raise EngineError(f"engine {plan.label!r} exited with status {proc.returncode}: {' '.join(plan.argv)}")
                if probe(plan.url) == 200:
                    pending.remove(i)
            if pending and time.monotonic() > deadline:
                raise EngineError(f"engines {[self.plans[i].label for i in pending]} not healthy after "
                                  f"{self.startup_timeout_s:.0f}s")
            if pending:
                self.stopping.wait(1.0)

    def start(self) -> None:
        """Start every engine and wait until all are healthy; then watch them."""
        for plan in self.plans:
            self.procs.append(self._spawn(plan))
        self._wait_healthy(list(range(len(self.plans))))
        self.watcher.start()

    def state(self, url: str) -> str | None:
        return self.states.get(url)

    def _failure(self, i: int) -> str | None:
        proc = self.procs[i]
        if proc.poll() is not None:
            return f"exited with status {proc.returncode}"
        if probe(self.plans[i].url) == 503:
            return "reports its batching worker dead (/health 503)"
        return None

    def _watch(self) -> None:
        while not self.stopping.wait(POLL_S):
            for i, plan in enumerate(self.plans):
                problem = self._failure(i)
                if problem is None or self.stopping.is_set():
                    continue
                if self.restarts[i] >= self.max_restarts:
                    self.states[plan.url] = "failed"
                    message = (f"engine {plan.label!r} {problem}; restarted {self.restarts[i]} of "
                               f"{self.max_restarts} times allowed: giving up")
                    log(message)
                    self.on_give_up(message)
                    return
                self._restart(i, problem)

    def _restart(self, i: int, problem: str) -> None:
        plan = self.plans[i]
        self.states[plan.url] = "restarting"
        self.restarts[i] += 1
        backoff = min(MAX_BACKOFF_S, 2.0 ** (self.restarts[i] - 1))
        log(f"engine {plan.label!r} {problem}; restart {self.restarts[i]} of {self.max_restarts} in {backoff:.0f}s")
        stop_processes([self.procs[i]], self.stop_grace_s)
        if self.stopping.wait(backoff):
            return
        self.procs[i] = self._spawn(plan)
        try:
            self._wait_healthy([i])
        except EngineError as error:
            log(str(error))
            return
        try:
            self.on_restarted(plan)
        except httpx.HTTPError as error:
            log(f"engine {plan.label!r}: the served set was not loaded back ({error}); restarting it again")
            stop_processes([self.procs[i]], self.stop_grace_s)
            return
        if not self.stopping.is_set():
            self.states.pop(plan.url, None)
            log(f"engine {plan.label!r} is healthy again")

    def stop(self) -> None:
        """Stop watching, then end every engine within `stop_grace_s` (SIGKILL after)."""
        self.stopping.set()
        if self.watcher.is_alive() and self.watcher is not threading.current_thread():
            self.watcher.join(timeout=self.stop_grace_s + 10)
        stop_processes(self.procs, self.stop_grace_s)
