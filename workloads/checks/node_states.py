"""Slurm's node states, and the readiness verdict on nodes Soperator's active checks drained.

A failed active check drains its node with a reason that starts with ``[node_problem]`` (or ``[hardware_problem]``
for the extensive check): nodesets that training would spread over are then smaller or broken. The readiness stage
refuses to go on while its partition has such a node, unless the run config's ``readiness.allow_drained_nodes``
says so. `python -m workloads.checks.node_states --help` runs only this check (it reads states, measures nothing).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from documents.readiness_report import CheckResult
from documents.run_config import load_run_config
from workloads.checks.readiness import check_line

NODE_PROBLEM = "[node_problem]"
HARDWARE_PROBLEM = "[hardware_problem]"
DRAIN_REASON_PREFIXES = (NODE_PROBLEM, HARDWARE_PROBLEM)
"""Reason prefixes of Soperator 4.1.7's active checks (helm/soperator-activechecks/values.yaml drainReasonPrefix)."""
SINFO_FORMAT = "%N|%T|%P|%E"
_STATE_FLAGS = "*~#!%$@^-"
POWER_FLAGS = {"~": "powered down", "#": "powering up", "%": "powering down"}
"""sinfo's power-saving suffixes (Slurm power saving; Soperator's ephemeral nodes)."""


class NodeState(BaseModel):
    """One node of one partition as ``sinfo --Node`` reports it."""

    model_config = ConfigDict(frozen=True)

    node: str
    state: str
    partition: str
    reason: str | None = None
    power: str | None = None
    """powered down, powering up or powering down (from sinfo's suffix); None: powered up."""

    @property
    def drained(self) -> bool:
        """drained, draining, or a state with a +DRAIN flag."""
        return "drain" in self.state.lower()

    def line(self) -> str:
        return f"{self.node} ({self.state}): {self.reason or 'no reason'}"


def sinfo_command(partition: str | None = None) -> list[str]:
    return ["sinfo", "--Node", "--noheader", f"--format={SINFO_FORMAT}", *(["--partition", partition] if partition else [])]


def parse_sinfo(text: str) -> list[NodeState]:
    """Rows of ``sinfo --Node --noheader --format=%N|%T|%P|%E`` (the reason may hold ``|``; ``none`` is no reason)."""
    states = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 3)
        if len(parts) != 4:
            raise ValueError(f"sinfo row {line!r}: expected node|state|partition|reason")
        node, state, partition, reason = (p.strip() for p in parts)
        flags = state[len(state.rstrip(_STATE_FLAGS)):]
        states.append(NodeState(node=node, state=state.rstrip(_STATE_FLAGS), partition=partition.rstrip("*"),
                                reason=None if reason in ("", "none") else reason,
                                power=next((POWER_FLAGS[f] for f in flags if f in POWER_FLAGS), None)))
    return states


def once_per_node(states: Iterable[NodeState]) -> list[NodeState]:
    """The first state of each node (sinfo lists a node once per partition)."""
    seen: dict[str, NodeState] = {}
    for s in states:
        seen.setdefault(s.node, s)
    return list(seen.values())


def problem_nodes(states: Iterable[NodeState]) -> list[NodeState]:
    """Drained nodes whose reason an active check wrote (one entry per node)."""
    return once_per_node(s for s in states if s.drained and s.reason and s.reason.startswith(DRAIN_REASON_PREFIXES))


def drained_check(states: Iterable[NodeState], partition: str | None, allowed: bool) -> CheckResult:
    """``drained_nodes``: fails while the partition has nodes the active checks drained, unless allowed."""
    where = f"partition {partition}" if partition else "every partition"
    bad = problem_nodes(states)
    if not bad:
        return CheckResult(name="drained_nodes", status="pass", value=0, detail=f"no node drained by a check in {where}")
    named = "; ".join(s.line() for s in bad)
    if allowed:
        return CheckResult(name="drained_nodes", status="info", value=len(bad),
                           detail=f"{named} (allowed by readiness.allow_drained_nodes)")
    return CheckResult(name="drained_nodes", status="fail", value=len(bad), threshold=0,
                       detail=f"{where} has drained nodes: {named}; resume them once repaired "
                              "(scontrol update nodename=NODE state=resume) or set readiness.allow_drained_nodes")


def read_states(partition: str | None) -> list[NodeState] | None:
    """The partition's node states from ``sinfo``; None where Slurm's tools are not installed."""
    try:
        return parse_sinfo(subprocess.run(sinfo_command(partition), capture_output=True, text=True, check=True,
                                          timeout=60).stdout)
    except FileNotFoundError:
        return None


def check_partition(partition: str | None, allowed: bool) -> CheckResult:
    """The readiness check as the readiness job runs it (``partition``: the job's own, SLURM_JOB_PARTITION)."""
    try:
        states = read_states(partition)
    except subprocess.CalledProcessError as error:
        return CheckResult(name="drained_nodes", status="fail", detail=f"sinfo failed: {error.stderr.strip()}")
    if states is None:
        return CheckResult(name="drained_nodes", status="skip", detail="sinfo not found: not on a Slurm node")
    return drained_check(states, partition, allowed)


def job_check(allowed: bool) -> CheckResult:
    """The check inside a Slurm job, over the job's partition; skipped outside one."""
    if "SLURM_JOB_ID" not in os.environ:
        return CheckResult(name="drained_nodes", status="skip", detail="not in a Slurm job")
    return check_partition(os.environ.get("SLURM_JOB_PARTITION"), allowed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workloads.checks.node_states", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="run config JSON; its readiness.allow_drained_nodes is used")
    p.add_argument("--partition", default=os.environ.get("SLURM_JOB_PARTITION"), help="default: the job's partition")
    p.add_argument("--allow-drained-nodes", action="store_true", default=None)
    args = p.parse_args(argv)
    allowed = bool(args.allow_drained_nodes)
    if args.config and args.allow_drained_nodes is None:
        section = load_run_config(args.config).readiness
        allowed = section is not None and section.allow_drained_nodes
    check = check_partition(args.partition, allowed)
    print(check_line(check), flush=True)
    return 1 if check.status == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
