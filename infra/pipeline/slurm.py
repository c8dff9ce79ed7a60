"""Slurm client over a Transport: submit, state, wait with progress, cancel, log tail.

Runs the Slurm command-line tools (sbatch, squeue, scontrol, sacct, scancel) on the transport's
machine, so the same code drives the local Slurm and a cluster's login node over SSH.
A job that ends in any state but COMPLETED, or that can never start, raises SlurmJobFailed with
its exit code and the last lines of its log.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from documents.metrics import MetricsRecord, read_metrics
from infra.pipeline.transport import Transport
from workloads.checks.node_states import NodeState, once_per_node, parse_sinfo, sinfo_command

SUCCESS = "COMPLETED"
FAILED_STATES = frozenset(
    {"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED"}
)
NEVER_RUNS_REASONS = frozenset({"DependencyNeverSatisfied"})
_JOB_ID = re.compile(r"^\d+$")
_SQUEUE_FORMAT = "%i|%T|%r|%j|%M|%N"

Progress = Callable[[str], None]


class SlurmError(RuntimeError):
    """A Slurm command failed or answered something unexpected."""


class JobNotFound(SlurmError):
    """Slurm no longer knows the job (left the queue and no accounting)."""


class JobInfo(BaseModel):
    """A job's state as Slurm reports it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    name: str | None = None
    state: str
    reason: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    elapsed_s: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    nodes: str | None = None
    dependency: str | None = None
    source: str

    @property
    def finished(self) -> bool:
        return self.state == SUCCESS or self.state in FAILED_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == SUCCESS

    @property
    def never_runs(self) -> bool:
        return self.state == "PENDING" and self.reason in NEVER_RUNS_REASONS

    @property
    def label(self) -> str:
        return f"job {self.job_id}" + (f" ({self.name})" if self.name else "")


class SlurmJobFailed(SlurmError):
    """A job failed, was cancelled, timed out, or can never run."""

    def __init__(self, info: JobInfo, log_tail: str, note: str = "", errors: Mapping[str, str] | None = None) -> None:
        self.info = info
        self.log_tail = log_tail
        self.errors = dict(errors or {})
        super().__init__(describe_failure(info, log_tail, self.errors) + (f"\n{note}" if note else ""))


class SlurmWaitTimeout(SlurmError):
    """wait() gave up; the job itself is left as it is."""


def describe_failure(info: JobInfo, log_tail: str, errors: Mapping[str, str] | None = None) -> str:
    """One readable paragraph: what happened to the job, its exit code, the first exception of each rank,
    and its log's last lines."""
    if info.never_runs or (info.state == "CANCELLED" and info.reason in NEVER_RUNS_REASONS):
        head = f"Slurm {info.label} can never run: {info.reason}"
        if info.dependency:
            head += f" (dependency {info.dependency})"
        return head + "; it was not started"
    head = f"Slurm {info.label} ended {info.state}"
    if info.exit_code is not None:
        head += f" with exit code {info.exit_code}"
        if info.signal:
            head += f" (signal {info.signal})"
    if info.reason and info.reason != "None":
        head += f", reason {info.reason}"
    if errors:
        head += "; first error of " + ("each rank" if len(errors) > 1 else "the job") + ":\n" + "\n".join(
            f"  {who}: {line}" for who, line in errors.items())
        head += "\n"
    return head + (f"; last lines of its log:\n{log_tail}" if log_tail.strip() else "; its log is empty or missing")


def parse_duration(text: str) -> int | None:
    """Seconds from Slurm's [D-][HH:]MM:SS (squeue %M, scontrol RunTime); None when unknown."""
    text = text.strip()
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text)
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """(exit code, signal) from Slurm's 'CODE:SIGNAL'."""
    m = re.fullmatch(r"(\d+):(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def parse_scontrol_record(line: str) -> dict[str, str]:
    """`scontrol show job -o` output as a dict; a token without '=' continues the previous value."""
    fields: dict[str, str] = {}
    key = None
    for token in line.split():
        if "=" in token and not token.startswith("="):
            key, _, value = token.partition("=")
            fields[key] = value
        elif key is not None:
            fields[key] += " " + token
    return fields


def _null(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "N/A", "Unknown", "None") else value


def info_from_scontrol(fields: Mapping[str, str]) -> JobInfo:
    code, sig = parse_exit_code(fields.get("ExitCode", ""))
    started = _null(fields.get("StartTime")) is not None
    return JobInfo(
        job_id=fields["JobId"],
        name=_null(fields.get("JobName")),
        state=fields.get("JobState", "UNKNOWN"),
        reason=_null(fields.get("Reason")),
        exit_code=code,
        signal=sig,
        elapsed_s=parse_duration(fields.get("RunTime", "")) if started else None,
        stdout=_null(fields.get("StdOut")),
        stderr=_null(fields.get("StdErr")),
        nodes=_null(fields.get("NodeList")),
        dependency=_null(fields.get("Dependency")),
        source="scontrol",
    )


def info_from_squeue(line: str) -> JobInfo:
    job_id, state, reason, name, elapsed, nodes = line.split("|", 5)
    return JobInfo(
        job_id=job_id,
        name=_null(name),
        state=state,
        reason=_null(reason),
        elapsed_s=parse_duration(elapsed),
        nodes=_null(nodes),
        source="squeue",
    )


def info_from_sacct(line: str) -> JobInfo:
    job_id, name, state, exit_code, elapsed, nodes, reason = line.split("|", 6)
    code, sig = parse_exit_code(exit_code)
    return JobInfo(
        job_id=job_id,
        name=_null(name),
        state=state.split()[0] if state else "UNKNOWN",
        reason=_null(reason),
        exit_code=code,
        signal=sig,
        elapsed_s=int(elapsed) if elapsed.isdigit() else None,
        nodes=_null(nodes),
        source="sacct",
    )


def latest_metrics(text: str, origin: str, job_id: str | None = None) -> MetricsRecord | None:
    """The newest training record (one with a loss) in the tail of a metrics.jsonl being written; with
    `job_id`, only that job's records (the file also holds the lines of earlier runs of the stage)."""
    records = read_metrics(text, origin, live=True)
    return next((r for r in reversed(records) if r.loss is not None and (job_id is None or r.job_id == job_id)), None)


_RANK_LINE = re.compile(r"^(?:(?P<node>\d+): )?(?:\[(?:default|rank)(?P<rank>\d+)\]:)?(?P<text>.*)$")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")
"""a traceback's last line: the exception's dotted name, then `: message` or nothing"""


def first_exceptions(log: str) -> dict[str, str]:
    """The first exception line of each rank's output in a job log: after a `Traceback` line, the first
    unindented line from the same rank that names an exception (torchrun --tee prefixes `[defaultN]:`, srun
    --label `N: `; the rank's stdout, teed apart from its stderr, can land inside the traceback). Without
    prefixes the key is "log". torchrun's own ChildFailedError is left out when the ranks said more."""
    pending: set[str] = set()
    found: dict[str, str] = {}
    for line in log.splitlines():
        match = _RANK_LINE.match(line)
        node, rank, text = match["node"], match["rank"], match["text"]
        who = f"rank {rank}" + (f" on node {node}" if node else "") if rank else (f"node {node}" if node else "log")
        if text.startswith("Traceback (most recent call last)"):
            if who not in found:
                pending.add(who)
        elif who in pending and _EXCEPTION_LINE.match(text):
            found[who] = text.strip()
            pending.discard(who)
    if len(found) > 1:
        found.pop("log", None)
    return found


def format_metrics(record: MetricsRecord) -> str:
    return f"step {record.step} loss {record.loss:.4f} epoch {record.epoch:.2f}"


def _check_id(job_id: str) -> str:
    job_id = str(job_id)
    if not _JOB_ID.match(job_id):
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return job_id


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class SlurmClient:
    """Slurm's command-line tools on the machine a Transport reaches; env (e.g. SLURM_CONF) goes to every command."""

    def __init__(
        self,
        transport: Transport,
        *,
        env: Mapping[str, str] | None = None,
        poll_s: float = 5.0,
        command_timeout: float = 120.0,
    ) -> None:
        self.transport = transport
        self.env = dict(env or {})
        self.poll_s = poll_s
        self.command_timeout = command_timeout

    def _run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None):
        return self.transport.run(list(argv), timeout=self.command_timeout, env={**self.env, **(env or {})}, cwd=cwd)

    def submit(
        self,
        script: str,
        args: Sequence[str] = (),
        *,
        job_name: str | None = None,
        dependencies: Sequence[str] = (),
        output: str | None = None,
        error: str | None = None,
        workdir: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        kill_on_invalid_dep: bool = True,
    ) -> str:
        """sbatch the script (a path on the Slurm machine); returns the job id.

        dependencies become --dependency=afterok:A:B, so the job starts only after they all
        completed; with kill_on_invalid_dep it is cancelled (not left pending) if one fails.
        env is exported to sbatch, which passes it into the job (--export=ALL).
        """
        argv = ["sbatch", "--parsable", "--export=ALL"]
        if job_name:
            argv.append(f"--job-name={job_name}")
        if output:
            argv.append(f"--output={output}")
        if error:
            argv.append(f"--error={error}")
        if workdir:
            argv.append(f"--chdir={workdir}")
        deps = [_check_id(d) for d in dependencies]
        if deps:
            argv.append("--dependency=afterok:" + ":".join(deps))
            if kill_on_invalid_dep:
                argv.append("--kill-on-invalid-dep=yes")
        argv += [*extra_args, script, *args]
        result = self._run(argv, env=env, cwd=workdir)
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        job_id = lines[-1].split(";")[0].strip() if lines else ""
        if not result.ok or not _JOB_ID.match(job_id):
            raise SlurmError(
                f"sbatch rejected {script}" + (f" ({job_name})" if job_name else "")
                + f" with exit code {result.exit_code}: {(result.stderr or result.stdout).strip()}"
            )
        return job_id

    def state(self, job_id: str) -> JobInfo:
        """The live state: squeue while the job is queued or running, then scontrol, then sacct."""
        job_id = _check_id(job_id)
        result = self._run(["squeue", "-h", "-j", job_id, "-o", _SQUEUE_FORMAT])
        if result.ok:
            for line in result.stdout.splitlines():
                if line.split("|", 1)[0] == job_id:
                    info = info_from_squeue(line)
                    if not info.finished:
                        return info
        return self.details(job_id)

    def details(self, job_id: str) -> JobInfo:
        """Full record (exit code, log paths) from scontrol, or sacct once scontrol forgot the job."""
        job_id = _check_id(job_id)
        result = self._run(["scontrol", "show", "job", "-o", job_id])
        if result.ok and result.stdout.strip():
            return info_from_scontrol(parse_scontrol_record(result.stdout.splitlines()[0]))
        acct = self._run(
            ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobIDRaw,JobName,State,ExitCode,ElapsedRaw,NodeList,Reason"]
        )
        for line in acct.stdout.splitlines() if acct.ok else []:
            if line.split("|", 1)[0] == job_id:
                return info_from_sacct(line)
        raise JobNotFound(
            f"Slurm does not know job {job_id}: {(result.stderr or '').strip()}"
            + (f"; sacct: {acct.stderr.strip()}" if not acct.ok else "")
        )

    def node_states(self, partition: str | None = None) -> list[NodeState]:
        """Every node's state and reason (``sinfo --Node``), one row per node and partition."""
        return parse_sinfo(self._run(sinfo_command(partition)).check().stdout)

    def waiting_on(self, info: JobInfo) -> str:
        """What a job that has not started waits for: each of its allocated nodes with its state (a node Slurm's
        power saving is bringing up, as ephemeral nodes are), else its pending reason."""
        if info.state not in ("PENDING", "CONFIGURING") or not info.nodes or info.nodes in ("(null)", "None"):
            return f"; reason {info.reason}" if info.reason and info.reason != "None" else ""
        names = self._run(["scontrol", "show", "hostnames", info.nodes])
        wanted = names.stdout.split() if names.ok else [info.nodes]
        sinfo = self._run(sinfo_command())
        rows = parse_sinfo(sinfo.stdout) if sinfo.ok else []
        states = {s.node: s for s in once_per_node(rows) if s.node in wanted}
        described = [f"{n} {(states[n].power or 'powered_up').replace('_', ' ')} ({states[n].state})" if n in states else f"{n} (unknown)"
                     for n in wanted]
        return f" on {', '.join(described)}"

    def cancel(self, job_id: str) -> JobInfo:
        """scancel a queued or running job; a finished job is left as it is. Returns its state after."""
        job_id = _check_id(job_id)
        before = self.state(job_id)
        if not before.finished:
            result = self._run(["scancel", job_id])
            if not result.ok and "already completing or completed" not in result.stderr:
                raise SlurmError(f"scancel {job_id} failed: {result.stderr.strip()}")
        return self.state(job_id)

    def log_tail(self, job: str | JobInfo, lines: int = 30) -> str:
        """The last lines of the job's stdout (and stderr when it goes to another file)."""
        info = job if isinstance(job, JobInfo) and job.source != "squeue" else self.details(
            job.job_id if isinstance(job, JobInfo) else job
        )
        paths = [p for p in dict.fromkeys([info.stdout, info.stderr]) if p]
        parts = []
        for path in paths:
            result = self._run(["tail", "-n", str(lines), path])
            if not result.ok:
                continue
            text = result.stdout.rstrip("\n")
            parts.append(f"==> {path} <==\n{text}" if len(paths) > 1 else text)
        return "\n".join(parts)

    def latest_metrics_record(self, path: str, lines: int = 50, job_id: str | None = None) -> MetricsRecord | None:
        result = self._run(["tail", "-n", str(lines), path])
        return latest_metrics(result.stdout, path, job_id) if result.ok else None

    def log_errors(self, info: JobInfo, lines: int = 5000) -> dict[str, str]:
        """The first exception of each rank in the job's log (see first_exceptions)."""
        found: dict[str, str] = {}
        for path in dict.fromkeys([info.stdout, info.stderr]):
            result = self._run(["tail", "-n", str(lines), path]) if path else None
            if result is not None and result.ok:
                found.update({k: v for k, v in first_exceptions(result.stdout).items() if k not in found})
        return found

    def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        progress: Progress | None = _stderr,
        metrics_path: str | None = None,
        log_lines: int = 30,
    ) -> JobInfo:
        """Poll until the job finishes; report state changes (and training step/loss) through progress.

        Returns the final JobInfo when it COMPLETED; raises SlurmJobFailed otherwise.
        """
        job_id = _check_id(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        seen: tuple[str, str | None] | None = None
        last_metrics: MetricsRecord | None = None
        while True:
            info = self.state(job_id)
            if (info.state, info.reason) != seen:
                seen = (info.state, info.reason)
                if progress:
                    reason = f" ({info.reason})" if info.reason and info.reason != "None" else ""
                    waiting = self.waiting_on(info) if info.state == "CONFIGURING" else ""
                    progress(f"{info.label}: {info.state}{reason}{waiting}")
            if metrics_path and info.state in ("RUNNING", "COMPLETING", SUCCESS):
                record = self.latest_metrics_record(metrics_path, job_id=job_id)
                if record and record != last_metrics:
                    last_metrics = record
                    if progress:
                        progress(f"{info.label}: {format_metrics(record)}")
            if info.finished or info.never_runs:
                if info.source == "squeue":
                    info = self.details(job_id)
                if info.succeeded:
                    if progress and info.elapsed_s is not None:
                        progress(f"{info.label}: finished in {info.elapsed_s}s")
                    return info
                raise SlurmJobFailed(info, self.log_tail(info, log_lines), errors=self.log_errors(info))
            if deadline is not None and time.monotonic() > deadline:
                raise SlurmWaitTimeout(f"gave up waiting for {info.label} after {timeout:g}s; it is {info.state}"
                                       f"{self.waiting_on(info)}")
            time.sleep(self.poll_s)

    def wait_all(
        self,
        job_ids: Sequence[str],
        *,
        timeout: float | None = None,
        progress: Progress | None = _stderr,
        metrics_paths: Mapping[str, str] | None = None,
        log_lines: int = 30,
    ) -> list[JobInfo]:
        """Wait for a chain in order; the first failure raises and names the later jobs it stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        done: list[JobInfo] = []
        for i, job_id in enumerate(job_ids):
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                done.append(
                    self.wait(
                        job_id,
                        timeout=left,
                        progress=progress,
                        metrics_path=(metrics_paths or {}).get(job_id),
                        log_lines=log_lines,
                    )
                )
            except SlurmJobFailed as failure:
                later = [self.state(j) for j in job_ids[i + 1 :]]
                note = ", ".join(f"{j.label} {j.state}" for j in later)
                raise SlurmJobFailed(failure.info, failure.log_tail, f"later jobs: {note}" if note else "",
                                     failure.errors) from None
        return done

