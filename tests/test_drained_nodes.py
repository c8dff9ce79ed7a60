"""Nodes Soperator's active checks drain: sinfo rows parsed, the readiness verdict, and on the real local Slurm a node
drained with a `[node_problem]` reason refused by readiness and shown by `ftstack status`, then resumed and run.

The local Slurm is shared with other tests: the drain lasts only while two in-process reads run, and the node is
resumed in the fixture's teardown whatever happens."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshd_fixtures import SshServer

from infra.commands.cli import main as ftstack
from infra.pipeline.slurm import SlurmClient
from infra.pipeline.ssh import SshTransport
from infra.pipeline.transport import LocalTransport
from workloads.checks import node_states
from workloads.checks.node_states import NodeState, drained_check, parse_sinfo, problem_nodes

ROOT = Path(__file__).resolve().parents[1]
REASON = "[node_problem] test drain (tests/test_drained_nodes.py)"

# sinfo --Node --noheader --format=%N|%T|%P|%E as Slurm 22.05 prints it (a default partition carries "*",
# a non-responding node "*" after its state)
ROWS = """w-0|drained|main*|[node_problem] all-reduce-perf-nccl-without-ib failed
w-0|drained|hidden|[node_problem] all-reduce-perf-nccl-without-ib failed
w-1|draining|main*|[hardware_problem] extensive-check: GPU 3 XID 79
w-2|drained*|main*|maintenance | by admin
w-3|mixed|main*|none
w-4|idle|main*|none
"""


def test_sinfo_rows_and_which_drains_are_the_checks() -> None:
    states = parse_sinfo(ROWS)
    assert [(s.node, s.state, s.partition) for s in states][:3] == [
        ("w-0", "drained", "main"), ("w-0", "drained", "hidden"), ("w-1", "draining", "main")]
    assert states[3].state == "drained" and states[3].reason == "maintenance | by admin"
    assert states[4].reason is None and not states[4].drained
    assert [s.node for s in problem_nodes(states)] == ["w-0", "w-1"]
    with pytest.raises(ValueError, match=r"sinfo row 'w-9\|idle': expected node\|state\|partition\|reason"):
        parse_sinfo("w-9|idle\n")


def test_readiness_refuses_names_nodes_and_reasons_unless_allowed() -> None:
    states = parse_sinfo(ROWS)
    refused = drained_check(states, "main", allowed=False)
    assert refused.status == "fail" and refused.value == 2
    assert "w-0 (drained): [node_problem] all-reduce-perf-nccl-without-ib failed" in refused.detail
    assert "w-1 (draining): [hardware_problem] extensive-check: GPU 3 XID 79" in refused.detail
    assert "w-2" not in refused.detail
    allowed = drained_check(states, "main", allowed=True)
    assert allowed.status == "info" and "allowed by readiness.allow_drained_nodes" in allowed.detail
    healthy = drained_check([s for s in states if s.node in ("w-3", "w-4")], "main", allowed=False)
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


@pytest.fixture
def drained_node(slurm: str) -> Iterator[tuple[str, str]]:
    """The local Slurm's first node of its default partition, drained with a [node_problem] reason; resumed after."""
    rows = parse_sinfo(subprocess.run(node_states.sinfo_command(), capture_output=True, text=True, check=True).stdout)
    node, partition = rows[0].node, rows[0].partition
    scontrol = ["scontrol", "update", f"nodename={node}"]
    subprocess.run([*scontrol, "state=drain", f"reason={REASON}"], check=True, capture_output=True, text=True)
    try:
        yield node, partition
    finally:
        subprocess.run([*scontrol, "state=resume"], capture_output=True, text=True)  # the test may have resumed it


@pytest.mark.slurm
def test_a_drained_node_is_refused_shown_and_after_resume_the_readiness_job_runs(
        drained_node, slurm: str, slurm_client: SlurmClient, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    node, partition = drained_node
    monkeypatch.chdir(ROOT)
    assert node_states.main(["--partition", partition]) == 1
    refusal = capsys.readouterr().out
    assert f"drained_nodes: fail 1 (threshold 0) - partition {partition} has drained nodes: {node}" in refusal
    assert REASON in refusal
    assert node_states.main(["--partition", partition, "--allow-drained-nodes"]) == 0
    assert ftstack(["status", "--stack", "local"]) == 0
    shown = capsys.readouterr().out
    assert "drained nodes: 1" in shown and f"  {node} (drained): {REASON}" in shown
    assert ftstack(["status", "--stack", "local", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["drained_nodes"]
    assert [(n["node"], n["reason"]) for n in listed] == [(node, REASON)]

    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=True)
    assert not _sinfo(slurm, node).drained
    assert node_states.main(["--partition", partition]) == 0
    assert "drained_nodes: pass 0" in capsys.readouterr().out
    assert ftstack(["status", "--stack", "local"]) == 0
    assert "drained nodes: none" in capsys.readouterr().out

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
