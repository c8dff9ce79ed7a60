"""Nodes out of service: sinfo rows parsed (every state, flag and Soperator reason kind), the readiness verdict, and
on the real local Slurm a node drained, downed or failed with each kind of reason, refused by readiness and shown
by `ftstack status`, then resumed and run.

The reasons are Soperator 4.1.7's: internal/consts/slurm.go (`[node_problem]`, `[user_problem]`, `[hardware_problem]`,
`[compute_maintenance]` with its node reboot and replacement reasons, `Kill task failed`), the `[user_problem] $name`
reasons of helm/slurm-cluster/slurm_scripts/*.json and `nvme_raid_health` (its `reason_base: $name`). The local Slurm
is this worktree's: each state lasts only while the checks read it, and the node is resumed in teardown."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sshd_fixtures import SshServer

from infra.commands.cli import main as ftstack
from infra.pipeline.slurm import SlurmClient
from infra.pipeline.ssh import SshTransport
from infra.pipeline.transport import LocalTransport
from workloads.checks import node_states
from workloads.checks.node_states import NodeState, drained_check, parse_sinfo, power_saving_nodes, unavailable_nodes

ROOT = Path(__file__).resolve().parents[1]
REASON = "[node_problem] test drain (tests/test_drained_nodes.py)"

# sinfo --Node --noheader --format=%N|%T|%P|%E as Slurm 22.05 prints it (a default partition carries "*",
# a non-responding node "*" after its state, a powered-down one "~", a powering-up one "#")
ROWS = """w-0|drained|main*|[node_problem] all-reduce-perf-nccl-without-ib failed
w-0|drained|hidden|[node_problem] all-reduce-perf-nccl-without-ib failed
w-1|draining|main*|[hardware_problem] extensive-check: GPU 3 XID 79
w-2|drained*|main*|maintenance | by admin
w-3|mixed|main*|none
w-4|idle|main*|none
w-5|down*|main*|Not responding
w-6|fail|main*|Kill task failed
w-7|idle*|main*|none
w-8|idle~|main*|none
w-9|idle#|main*|none
w-10|down~|main*|[compute_maintenance] node replacement process
"""

# (scontrol state, reason, sinfo state, kind)
KINDS = [
    ("drain", "[node_problem] all-reduce-perf-nccl-without-ib failed", "drained", "node problem"),
    ("drain", "[hardware_problem] extensive-check: GPU 3 XID 79", "drained", "hardware problem"),
    ("drain", "[user_problem] boot_disk_full.sh: / is 96% full", "drained", "user problem"),
    ("drain", "[compute_maintenance] node reboot process", "drained", "compute maintenance"),
    ("down", "[compute_maintenance] node replacement process", "down", "compute maintenance"),
    ("down", "Kill task failed", "down", "kill task failed"),
    ("fail", "nvme_raid_health: RAID array md0 is degraded: missing 1 device(s)", "fail", "NVMe RAID health"),
    ("down", "rack 4 power work (ops ticket 1187)", "down", None),
]


def test_sinfo_rows_states_flags_and_reason_kinds() -> None:
    states = parse_sinfo(ROWS)
    assert [(s.node, s.state, s.partition) for s in states][:3] == [
        ("w-0", "drained", "main"), ("w-0", "drained", "hidden"), ("w-1", "draining", "main")]
    assert states[3].state == "drained" and states[3].reason == "maintenance | by admin" and states[3].not_responding
    assert states[4].reason is None and not states[4].unavailable
    assert [s.node for s in unavailable_nodes(states)] == ["w-0", "w-1", "w-2", "w-5", "w-6", "w-7", "w-10"]
    assert [(s.node, s.power) for s in power_saving_nodes(states)] == [("w-8", "powered_down"), ("w-9", "powering_up")]
    kinds = {s.node: s.kind for s in states}
    assert (kinds["w-0"], kinds["w-1"], kinds["w-2"], kinds["w-6"], kinds["w-10"]) == (
        "node problem", "hardware problem", None, "kill task failed", "compute maintenance")
    assert states[-1].line() == "w-10 (down, powered down; compute maintenance): [compute_maintenance] node replacement process"
    assert states[3].line() == "w-2 (drained, not responding): maintenance | by admin"
    with pytest.raises(ValueError, match=r"sinfo row 'w-9\|idle': expected node\|state\|partition\|reason"):
        parse_sinfo("w-9|idle\n")


def test_readiness_refuses_every_unavailable_node_naming_state_and_reason_unless_allowed() -> None:
    states = parse_sinfo(ROWS)
    refused = drained_check(states, "main", allowed=False)
    assert refused.status == "fail" and refused.value == 7
    assert "w-0 (drained; node problem): [node_problem] all-reduce-perf-nccl-without-ib failed" in refused.detail
    assert "w-1 (draining; hardware problem): [hardware_problem] extensive-check: GPU 3 XID 79" in refused.detail
    assert "w-5 (down, not responding): Not responding" in refused.detail
    assert "w-6 (fail; kill task failed): Kill task failed" in refused.detail
    assert "w-7 (idle, not responding): no reason" in refused.detail
    assert "w-8" not in refused.detail and "w-9" not in refused.detail
    allowed = drained_check(states, "main", allowed=True)
    assert allowed.status == "info" and "allowed by readiness.allow_drained_nodes" in allowed.detail
    healthy = drained_check([s for s in states if s.node in ("w-3", "w-4", "w-8", "w-9")], "main", allowed=False)
    assert healthy.status == "pass"


def _sinfo(slurm: str, node: str) -> NodeState:
    return next(s for s in SlurmClient(LocalTransport(), env={"SLURM_CONF": slurm}).node_states() if s.node == node)


@pytest.mark.slurm
def test_node_states_read_over_ssh_as_on_the_login_node(sshd: SshServer, slurm: str) -> None:
    """What `ftstack status` reads on a cluster or cloud stack: sinfo through the SSH transport."""
    with SshTransport(sshd.host, port=sshd.port, user=sshd.user, private_key=sshd.private_key,
                      host_key=sshd.host_public_key) as transport:
        remote = SlurmClient(transport, env={"SLURM_CONF": slurm}).node_states()
    local = SlurmClient(LocalTransport(), env={"SLURM_CONF": slurm}).node_states()
    assert remote and [s.node for s in remote] == [s.node for s in local]
    assert {s.partition for s in remote} == {s.partition for s in local}


def _first_row() -> NodeState:
    return parse_sinfo(subprocess.run(node_states.sinfo_command(), capture_output=True, text=True, check=True).stdout)[0]


def _back_in_service(timeout_s: float = 60) -> None:
    """A node resumed from down or fail re-registers: it shows not responding (``idle*``) for a moment."""
    deadline = time.monotonic() + timeout_s
    while _first_row().unavailable:
        if time.monotonic() > deadline:
            pytest.fail(f"local Slurm node still unavailable {timeout_s:.0f}s after resume: {_first_row().line()}")
        time.sleep(0.5)


@contextmanager
def node_in(state: str, reason: str) -> Iterator[tuple[str, str]]:
    """The local Slurm's first node of its default partition put in ``state`` with ``reason``; resumed after."""
    _back_in_service()
    row = _first_row()
    scontrol = ["scontrol", "update", f"nodename={row.node}"]
    subprocess.run([*scontrol, f"state={state}", f"reason={reason}"], check=True, capture_output=True, text=True)
    try:
        yield row.node, row.partition
    finally:
        subprocess.run([*scontrol, "state=resume"], capture_output=True, text=True)  # the test may have resumed it
        _back_in_service()


@pytest.fixture
def drained_node(slurm: str) -> Iterator[tuple[str, str]]:
    with node_in("drain", REASON) as where:
        yield where


@pytest.mark.slurm
@pytest.mark.parametrize(("state", "reason", "shown", "kind"), KINDS, ids=[f"{k[0]}-{k[3] or 'other'}" for k in KINDS])
def test_each_state_and_reason_kind_is_refused_and_shown(state, reason, shown, kind, slurm: str,
                                                         capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    with node_in(state, reason) as (node, partition):
        assert node_states.main(["--partition", partition]) == 1
        label = f"{shown}; {kind}" if kind else shown
        assert f"has unavailable nodes: {node} ({label}): {reason}" in capsys.readouterr().out
        assert ftstack(["status", "--stack", "local"]) == 0
        assert f"unavailable nodes: 1\n  {node} ({label}): {reason}" in capsys.readouterr().out
        assert ftstack(["status", "--stack", "local", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)["unavailable_nodes"]
        assert [(n["node"], n["state"], n["reason"], n["kind"]) for n in listed] == [(node, shown, reason, kind)]


@pytest.mark.slurm
def test_a_drained_node_is_refused_shown_and_after_resume_the_readiness_job_runs(
        drained_node, slurm: str, slurm_client: SlurmClient, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    node, partition = drained_node
    monkeypatch.chdir(ROOT)
    assert node_states.main(["--partition", partition]) == 1
    refusal = capsys.readouterr().out
    assert f"drained_nodes: fail 1 (threshold 0) - partition {partition} has unavailable nodes: {node}" in refusal
    assert REASON in refusal
    assert node_states.main(["--partition", partition, "--allow-drained-nodes"]) == 0
    assert ftstack(["status", "--stack", "local"]) == 0
    shown = capsys.readouterr().out
    assert "unavailable nodes: 1" in shown and f"  {node} (drained; node problem): {REASON}" in shown
    assert ftstack(["status", "--stack", "local", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["unavailable_nodes"]
    assert [(n["node"], n["reason"]) for n in listed] == [(node, REASON)]

    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=True)
    _back_in_service()
    assert not _sinfo(slurm, node).unavailable
    assert node_states.main(["--partition", partition]) == 0
    assert "drained_nodes: pass 0" in capsys.readouterr().out
    assert ftstack(["status", "--stack", "local"]) == 0
    assert "unavailable nodes: none" in capsys.readouterr().out

    config = tmp_path / "run.json"
    base = json.loads((ROOT / "workloads" / "configs" / "local.json").read_text())
    base["readiness"] = {**base["readiness"], "matmul_size": 64, "bandwidth_mib": 1, "allreduce_mib": 1, "iterations": 1}
    config.write_text(json.dumps(base))
    job = slurm_client.submit(
        str(ROOT / "workloads" / "jobs" / "readiness.sbatch"), [str(config)], job_name="ft-readiness-drain-test",
        output=str(tmp_path / "readiness-%j.out"), workdir=str(tmp_path),
        env={"FT_ROOT": str(tmp_path), "FT_PYTHON": sys.executable, "FT_CODE_DIR": str(ROOT)},
    )
    slurm_client.wait(job, timeout=300, progress=None)
    report = json.loads((tmp_path / "results" / f"readiness-{job}.json").read_text())
    drained = next(c for c in report["checks"] if c["name"] == "drained_nodes")
    assert report["ok"] and drained["status"] == "pass" and partition in drained["detail"]
