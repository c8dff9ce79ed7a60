"""Slurm power saving on the rehearsal cluster, as Soperator's ephemeral nodes use it: idle nodes power down after
SuspendTime (SuspendProgram stops their slurmd), a job powers them up (ResumeProgram starts it) and runs, and a node
lost mid-job requeues the job, which powers the node up again and resumes from its checkpoint. `ftstack status`
shows the powered-down and powering-up nodes; the pipeline's wait names them in its progress and its timeout."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cluster_fixtures import Cluster
from slurm_jobs import job_field, release_requeued, wait_for

from infra.commands.cli import main as ftstack
from infra.config import load_stack_config
from infra.pipeline.slurm import SlurmClient, SlurmWaitTimeout
from infra.pipeline.transport import LocalTransport
from workloads.checks.node_states import parse_sinfo

SUSPEND_S = 3
# a job that counts to 12, one a second, keeping its count in the jail: requeued, it goes on from the count saved.
# Past step 3 it waits for `$1.go`, which the test writes once Slurm has requeued it: the node is lost while the job
# runs however slow this machine is (a fixed 12 s job could end before a slow `lose-node` did).
COUNTER = """#!/bin/sh
#SBATCH --requeue
#SBATCH --open-mode=append
count=$(cat "$1" 2>/dev/null || echo 0)
echo "start at $count, restart ${SLURM_RESTART_COUNT:-0} on $(hostname)"
while [ "$count" -lt 12 ]; do
  srun --nodes=2 --ntasks=2 true
  if [ "$count" -ge 3 ] && [ ! -e "$1.go" ]; then sleep 1; continue; fi
  count=$((count + 1)); echo "$count" >"$1.tmp" && mv "$1.tmp" "$1"; echo "step $count"; sleep 1
done
"""


@contextmanager
def power_agent_paused(cluster: Cluster) -> Iterator[None]:
    """The rehearsal's power agent (what acts on Slurm's ResumeProgram requests, as Soperator's operator starts a
    worker pod) stopped: a node Slurm powers up stays powering up until the block ends, however slow this machine
    is (it otherwise comes up in a second or two, racing the checks that show it powering up)."""
    agent = int((cluster.base / "run" / "power-agent.pid").read_text())
    os.killpg(agent, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(agent, signal.SIGCONT)


def test_power_saving_states_come_from_sinfo_suffixes() -> None:
    """sinfo --Node %T as Slurm 22.05 printed it on the rehearsal cluster (idle~, allocated#, idle%)."""
    rows = parse_sinfo("fe-n1|idle~|cluster*|none\nfe-n2|allocated#|cluster*|none\nfe-n3|idle%|cluster*|none\n"
                       "fe-n4|mixed|cluster*|none\nfe-n5|down~|cluster*|ResumeTimeout reached\n")
    assert [(r.node, r.state, r.power) for r in rows] == [
        ("fe-n1", "idle", "powered_down"), ("fe-n2", "allocated", "powering_up"), ("fe-n3", "idle", "powering_down"),
        ("fe-n4", "mixed", None), ("fe-n5", "down", "powered_down")]


def _states(cluster: Cluster) -> dict[str, str]:
    out = subprocess.run(["sinfo", "--Node", "--noheader", "--format=%N|%T|%P|%E"], capture_output=True, text=True,
                         env={**os.environ, "SLURM_CONF": str(cluster.slurm_conf)}, check=True).stdout
    return {s.node: s.power or "up" for s in parse_sinfo(out)}


def _status(cluster: Cluster, config_dir: Path, name: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert ftstack(["status", "--stack", name, "--config-dir", str(config_dir),
                    "--ssh-key", str(cluster.private_key)]) == 0
    return capsys.readouterr().out


@pytest.mark.cluster
@pytest.mark.slow
def test_idle_nodes_power_down_a_job_powers_them_up_and_a_lost_node_requeues_and_resumes(
        local_cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_config = Path(__file__).resolve().parents[1] / "workloads" / "configs" / "cluster.json"
    local_cluster.stack_file(tmp_path / "stacks", "power", run_config)
    # the job asks for its nodes' CPUs, as the pipeline's jobs do: each node is then allocated, not mixed
    cpus = load_stack_config("power", tmp_path / "stacks").cluster.cpus_per_node
    work = local_cluster.jail / "power-test" / uuid.uuid4().hex[:8]
    work.mkdir(parents=True)
    node_work = f"{local_cluster.jail_root}/{work.relative_to(local_cluster.jail)}"
    (work / "counter.sh").write_text(COUNTER)
    log = work / "job.log"
    env = {**os.environ, "SLURM_CONF": str(local_cluster.slurm_conf)}
    job = None
    try:
        on = local_cluster.script("start", "--suspend-time", str(SUSPEND_S))
        assert on.returncode == 0, on.stderr
        wait_for(lambda: set(_states(local_cluster).values()) == {"powered_down"}, 120, "idle nodes to power down", log)
        shown = _status(local_cluster, tmp_path / "stacks", "power", capsys)
        assert f"power saving: {len(local_cluster.workers)}" in shown and f"{local_cluster.workers[0]} (idle, powered down)" in shown

        with power_agent_paused(local_cluster):
            job = subprocess.run(["sbatch", "--parsable", "--nodes=2", f"--cpus-per-task={cpus}",
                                  f"--output={node_work}/job.log", str(work / "counter.sh"), f"{node_work}/count"],
                                 capture_output=True, text=True, env=env, check=True).stdout.strip().split(";")[0]
            wait_for(lambda: "powering_up" in _states(local_cluster).values(), 60, "the job to power the nodes up", log)
            assert "powering up" in _status(local_cluster, tmp_path / "stacks", "power", capsys)
            client = SlurmClient(LocalTransport(), env={"SLURM_CONF": str(local_cluster.slurm_conf)}, poll_s=0.5)
            lines: list[str] = []
            named = rf"CONFIGURING on {local_cluster.workers[0]} powering up \(allocated\)"
            with pytest.raises(SlurmWaitTimeout, match=rf"after 1s; it is {named}"):
                client.wait(job, timeout=1, progress=lines.append)
            assert any(re.search(named, line) for line in lines), lines
        wait_for(lambda: "step 3" in (log.read_text() if log.exists() else ""), 180, "the job to run", log)

        lost = local_cluster.script("lose-node", local_cluster.workers[1])
        assert lost.returncode == 0, lost.stderr
        wait_for(lambda: job_field(job, "Restarts", local_cluster.slurm_conf) == "1", 120, "Slurm to requeue", log)
        (work / "count.go").write_text("")
        release_requeued(job, log, local_cluster.slurm_conf)
        wait_for(lambda: job_field(job, "JobState", local_cluster.slurm_conf) == "COMPLETED", 300,
                 "the requeued job to power the lost node up and finish", log)
    finally:
        if job:
            subprocess.run(["scancel", job], capture_output=True, env=env)
        off = local_cluster.script("start", "--suspend-time", "0")
    assert off.returncode == 0, off.stderr
    text = log.read_text()
    first, second = (line for line in text.splitlines() if line.startswith("start at"))
    assert first.startswith("start at 0, restart 0")
    resumed = int(second.split()[2].rstrip(","))
    assert resumed == 3 and "restart 1" in second, text
    assert text.count("step 12") == 1 and (work / "count").read_text().strip() == "12"
    shutil.rmtree(work, ignore_errors=True)
