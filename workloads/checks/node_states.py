"""Slurm's node states, and the readiness verdict on nodes that cannot run work.

A node is unavailable while it is drained or draining, down, failed or failing, or not responding (sinfo's ``*``
flag). Soperator drains with reasons that start with a known prefix (Soperator 4.1.7 ``internal/consts/slurm.go``:
``[node_problem]``, ``[user_problem]``, ``[hardware_problem]``, ``[compute_maintenance]``, ``Kill task failed``; the
jail's ``nvme_raid_health`` check drains with its own name): those are labelled by kind, any other reason is shown as
written. The readiness stage refuses to go on while its partition has an unavailable node, unless the run config's
``readiness.allow_drained_nodes`` says so. Power-saving states (powered down, powering up or down) are not failures:
Slurm wakes such a node for a job; they are reported apart (``NodeState.power``).
`python -m workloads.checks.node_states --help` runs only this check (it reads states, measures nothing).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, computed_field

from documents.readiness_report import CheckResult
from documents.run_config import load_run_config
from workloads.checks.readiness import check_line

NODE_PROBLEM = "[node_problem]"
USER_PROBLEM = "[user_problem]"
HARDWARE_PROBLEM = "[hardware_problem]"
COMPUTE_MAINTENANCE = "[compute_maintenance]"
KILL_TASK_FAILED = "Kill task failed"
NVME_RAID_HEALTH = "nvme_raid_health"
REASON_KINDS: tuple[tuple[str, str], ...] = (
    (KILL_TASK_FAILED, "kill task failed"),
    (COMPUTE_MAINTENANCE, "compute maintenance"),
    (NODE_PROBLEM, "node problem"),
    (USER_PROBLEM, "user problem"),
    (HARDWARE_PROBLEM, "hardware problem"),
    (NVME_RAID_HEALTH, "NVMe RAID health"),
)
"""Reason prefix -> kind. Soperator 4.1.7: ``SlurmNodeReasonsList`` of internal/consts/slurm.go (the first five, its
node replacement and reboot reasons being ``[compute_maintenance] node replacement process``/``node reboot
process``); helm/slurm-cluster/slurm_scripts/nvme_raid_health.sh.json drains with ``reason_base: $name``."""
UNAVAILABLE_STATES = ("drain", "down", "fail", "inval")
"""Base states (sinfo ``%T``) that take a node out of service: drained/draining, down, fail/failing, invalid."""
NOT_RESPONDING = "*"
POWER_FLAGS: dict[str, str] = {"~": "powered_down", "#": "powering_up", "%": "powering_down", "!": "power_down_pending"}
"""sinfo's power-saving suffixes of a state (man sinfo, NODE STATE CODES)."""
SINFO_FORMAT = "%N|%T|%P|%E"
_STATE_FLAGS = "*~#!%$@^-"
PowerState = Literal["powered_down", "powering_up", "powering_down", "power_down_pending"]


class NodeState(BaseModel):
    """One node of one partition as ``sinfo --Node`` reports it."""

    model_config = ConfigDict(frozen=True)

    node: str
    state: str
    """The base state without sinfo's suffix flags."""
    partition: str
    reason: str | None = None
    flags: str = ""
    """sinfo's suffix flags of the state (``*`` not responding, ``~`` powered down, ``#`` powering up, ...)."""

    @property
    def drained(self) -> bool:
        """drained, draining, or a state with a +DRAIN flag."""
        return "drain" in self.state.lower()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def not_responding(self) -> bool:
        return NOT_RESPONDING in self.flags

    @computed_field  # type: ignore[prop-decorator]
    @property
    def unavailable(self) -> bool:
        """Out of service: drained, down, failed, invalid or not responding."""
        return self.not_responding or any(s in self.state.lower() for s in UNAVAILABLE_STATES)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def power(self) -> PowerState | None:
        """The node's power-saving state, None when powered up."""
        return next((POWER_FLAGS[f] for f in self.flags if f in POWER_FLAGS), None)  # type: ignore[return-value]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def kind(self) -> str | None:
        """The kind of a known reason prefix (Soperator's), None for any other reason."""
        return next((kind for prefix, kind in REASON_KINDS if self.reason and self.reason.startswith(prefix)), None)

    def state_label(self) -> str:
        parts = [self.state, *(["not responding"] if self.not_responding else []),
                 *([self.power.replace("_", " ")] if self.power else [])]
        return ", ".join(parts)

    def line(self) -> str:
        kind = f"; {self.kind}" if self.kind else ""
        return f"{self.node} ({self.state_label()}{kind}): {self.reason or 'no reason'}"


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
        base = state.rstrip(_STATE_FLAGS)
        states.append(NodeState(node=node, state=base, partition=partition.rstrip("*"), flags=state[len(base):],
                                reason=None if reason in ("", "none") else reason))
    return states


def once_per_node(states: Iterable[NodeState]) -> list[NodeState]:
    """The first state of each node (sinfo lists a node once per partition)."""
    seen: dict[str, NodeState] = {}
    for s in states:
        seen.setdefault(s.node, s)
    return list(seen.values())


def unavailable_nodes(states: Iterable[NodeState]) -> list[NodeState]:
    """Nodes out of service (drained, down, failed, not responding), one entry per node."""
    return once_per_node(s for s in states if s.unavailable)


def power_saving_nodes(states: Iterable[NodeState]) -> list[NodeState]:
    """Nodes in a power-saving state that are otherwise in service, one entry per node."""
    return once_per_node(s for s in states if s.power and not s.unavailable)


def drained_check(states: Iterable[NodeState], partition: str | None, allowed: bool) -> CheckResult:
    """``drained_nodes``: fails while the partition has unavailable nodes, unless allowed."""
    where = f"partition {partition}" if partition else "every partition"
    bad = unavailable_nodes(states)
    if not bad:
        return CheckResult(name="drained_nodes", status="pass", value=0, detail=f"no unavailable node in {where}")
    named = "; ".join(s.line() for s in bad)
    if allowed:
        return CheckResult(name="drained_nodes", status="info", value=len(bad),
                           detail=f"{named} (allowed by readiness.allow_drained_nodes)")
    return CheckResult(name="drained_nodes", status="fail", value=len(bad), threshold=0,
                       detail=f"{where} has unavailable nodes: {named}; resume them once repaired "
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
