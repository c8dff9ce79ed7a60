"""`ftstack run` without the Pulumi engine: the same bundle upload and SlurmJob provider, state in a file.

The state file (`.local/pipeline/<stack>.json`) plays the part of Pulumi's state: for each stage it
keeps the provider's last inputs and outputs. A stage is resubmitted when the provider's diff says
its inputs changed, or when its last job failed or was cancelled; otherwise it is kept, so a second
run with nothing changed submits nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import paramiko
from pydantic import BaseModel

from documents.evaluator_report import EvaluatorReport
from documents.names import checked_name
from documents.pipeline_state import PipelineState, StageRecord, load_state, save_state
from documents.publication import Publication, publication_name, read_publication
from documents.run_config import load_run_config
from infra.config import StackConfig
from infra.pipeline.environment_source import ship_source
from infra.pipeline.bundle import upload_bundle
from infra.pipeline.chain import (
    JobSpec,
    check_run_config_path,
    code_hash,
    job_arguments,
    log_dirs,
    pipeline_jobs,
    code_location_for,
    run_root,
    slurm_env,
)
from infra.pipeline.connect import open_transport
from infra.pipeline.datasource import fingerprint_source
from infra.pipeline.jobs import SlurmJobProvider, job_inputs, read_result
from infra.pipeline.run_lock import stack_lock
from infra.pipeline.slurm import JobNotFound, SlurmClient, SlurmJobFailed
from infra.pipeline.transport import Transport, TransportError
from infra.runs.measured import price_inputs
from infra.cost.price import measured_plan
from workloads.checks.node_states import NodeState, once_per_node

Progress = Callable[[str], None]
PASSPHRASE_ENV = "FT_SSH_KEY_PASSPHRASE"
RECONNECTS = 5
LINK_ERRORS = (TransportError, paramiko.SSHException, EOFError, ConnectionError, TimeoutError)
RETRY_STATES = {"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class PipelineRun(BaseModel):
    """What one `ftstack run` did: the jobs (submitted or kept) and, when waited for, the evaluation."""

    stack: str
    started_at: str | None
    bundle_hash: str
    submitted: list[str]
    kept: list[str]
    jobs: dict[str, dict[str, Any]]
    evaluation: EvaluatorReport | None = None
    publication: Publication | None = None


def state_path(repo_root: Path, stack_name: str) -> Path:
    return repo_root / ".local" / "pipeline" / f"{checked_name(stack_name, 'stack name')}.json"


def transport_spec(stack: StackConfig, *, login_host: str | None = None, private_key: str | None = None,
                   known_hosts: str | None = None, repo_root: Path = Path(".")) -> dict[str, Any]:
    """Local stack: this machine. Cloud and existing-cluster stacks: SSH to the login node with the pipeline's
    key (an existing cluster's login address and pinned host key come from its `cluster` section)."""
    if stack.target == "local":
        return {"kind": "local"}
    if stack.cluster is not None:
        login_host = login_host or stack.cluster.login_host
    if not login_host or not private_key:
        raise ValueError(
            f"stack {stack.stack!r} runs over SSH: give the login address (--login-host or FT_LOGIN_HOST) "
            "and the pipeline key (--ssh-key FILE or FT_SSH_PRIVATE_KEY)"
        )
    spec: dict[str, Any] = {
        "kind": "ssh", "host": login_host, "user": stack.pipeline.ssh_user, "port": stack.pipeline.ssh_port,
        "private_key": private_key, "host_key": stack.pipeline.login_host_key, "known_hosts": known_hosts,
    }
    if stack.cluster is not None:
        spec.update(user=stack.cluster.user, port=stack.cluster.login_port,
                    host_key=stack.cluster.pinned_host_key(repo_root))
    if stack.pipeline.require_pinned_host_key:
        spec["require_pinned"] = True
    if os.environ.get(PASSPHRASE_ENV):
        spec["passphrase"] = os.environ[PASSPHRASE_ENV]
    return spec


def redacted(transport: dict[str, Any]) -> dict[str, Any]:
    """The transport spec as the state file keeps it: no private key, no passphrase."""
    return {k: v for k, v in transport.items() if k not in ("private_key", "passphrase")}


def _reusable(provider: SlurmJobProvider, record: StageRecord | None, props: dict[str, Any], live_state: str) -> bool:
    if record is None or live_state in RETRY_STATES:
        return False
    comparable = {**props, "transport": redacted(props["transport"])}
    return not provider.diff(record.outs["job_id"], record.outs, comparable).replaces


def _live_state(provider: SlurmJobProvider, record: StageRecord | None, props: dict[str, Any]) -> str:
    """The recorded job's state now, read through the (new) transport; a forgotten job counts as gone."""
    if record is None:
        return ""
    try:
        return provider.read(record.outs["job_id"], {**record.outs, "transport": props["transport"]}).outs["state"]
    except JobNotFound:
        return "CANCELLED"


def submit_chain(
    stack: StackConfig,
    repo_root: Path,
    transport: dict[str, Any],
    *,
    serve: bool = False,
    progress: Progress = print,
) -> tuple[PipelineState, PipelineRun, list[JobSpec]]:
    """Upload the bundle and submit every stage whose inputs changed or whose last job failed."""
    run_config_path = stack.pipeline.run_config
    check_run_config_path(run_config_path)
    run = load_run_config(repo_root / run_config_path)
    location = code_location_for(stack, run, repo_root)
    state_file = state_path(repo_root, stack.stack)
    state = load_state(state_file, stack.stack)
    state.slurm_env = location.slurm_env
    channel = open_transport(transport)
    state.data_source = fingerprint_source(channel, run, run_root(run, location), state.data_source)
    if state.data_source is not None:
        progress(f"data {run.data.source}: sha256 {state.data_source.sha256[:16]} ({state.data_source.size} bytes)")
    if location.environment is not None:
        shipped = ship_source(channel, location.environment, repo_root, serve=serve)
        progress(f"environment {location.environment.key} ({location.environment.source}): lock "
                 f"{'shipped to' if shipped['shipped'] else 'already at'} {shipped['source_dir']}")
    bundle = upload_bundle(channel, repo_root, location.code_root)
    progress(f"bundle {bundle['content_hash']} {'uploaded to' if bundle['uploaded'] else 'already at'} {bundle['path']}")
    state.bundle = {k: bundle[k] for k in ("content_hash", "path")}
    jobs = pipeline_jobs(stack, run, run_config_path, code_hash(repo_root), location, serve=serve,
                         data_sha256=state.data_source.sha256 if state.data_source else None,
                         plan=measured_plan(stack, price_inputs(stack, repo_root), run))
    channel.run(["mkdir", "-p", *log_dirs(jobs)], timeout=60).check()
    submitted, kept = _submit_changed(jobs, state, state_file, bundle["path"], transport, location.slurm_env, progress)
    if submitted:
        state.evaluation = None
        state.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        save_state(state_file, state)
    result = PipelineRun(stack=stack.stack, started_at=state.started_at, bundle_hash=bundle["content_hash"],
                         submitted=submitted, kept=kept,
                         jobs=_public_jobs(state), evaluation=state.evaluation)
    return state, result, jobs

def _submit_changed(jobs: list[JobSpec], state: PipelineState, state_file: Path, bundle_path: str,
                    transport: dict[str, Any], slurm_env: dict[str, str], progress: Progress) -> tuple[list[str], list[str]]:
    """Each job in order: kept where its inputs are unchanged and its job is still good, else (its old job cancelled)
    submitted; the state saved after each. Returns (submitted, kept) stages."""
    provider = SlurmJobProvider()
    ids: dict[str, str] = {}
    submitted, kept = [], []
    for job in jobs:
        props = job_inputs(**job_arguments(job, bundle_path=bundle_path, dependencies=[ids[d] for d in job.depends_on],
                                           transport=transport, slurm_env=slurm_env, wait=False))
        record = state.stages.get(job.stage)
        live = _live_state(provider, record, props)
        if _reusable(provider, record, props, live):
            outs = {**record.outs, "state": live}
            kept.append(job.stage)
            progress(f"{job.stage}: unchanged, keeping job {outs['job_id']} ({live})")
        else:
            if record is not None and live and live not in RETRY_STATES:
                provider.delete(record.outs["job_id"], {**record.outs, "transport": transport})
            outs = provider.create(props).outs
            submitted.append(job.stage)
            progress(f"{job.stage}: submitted job {outs['job_id']}")
        ids[job.stage] = outs["job_id"]
        state.stages[job.stage] = StageRecord(stage=job.stage, outs={**outs, "transport": redacted(transport)})
        save_state(state_file, state)
    return submitted, kept



def wait_chain(
    stack: StackConfig,
    repo_root: Path,
    transport: dict[str, Any],
    jobs: list[JobSpec],
    state: PipelineState,
    *,
    progress: Progress = print,
) -> PipelineState:
    """Wait for the chain in order with progress; record final states and the eval job's report.

    A connection that drops while waiting (the SSH link to a login node) is opened again and the wait goes on
    with the same job ids, up to RECONNECTS times: waiting only reads, so nothing is ever resubmitted."""
    chain = [job for job in jobs if job.stage != "serve"]
    ids = [state.stages[job.stage].outs["job_id"] for job in chain]
    metrics = {state.stages[job.stage].outs["job_id"]: job.metrics_path for job in chain if job.metrics_path}
    state_file = state_path(repo_root, stack.stack)

    def connect() -> SlurmClient:
        return SlurmClient(open_transport(transport), env=state.slurm_env, poll_s=2.0)

    client = connect()
    try:
        for attempt in range(RECONNECTS + 1):
            try:
                client.wait_all(ids, progress=progress, metrics_paths=metrics)
                break
            except LINK_ERRORS as drop:
                if attempt == RECONNECTS:
                    raise TransportError(f"lost the connection {RECONNECTS + 1} times while waiting: {drop}") from drop
                progress(f"connection lost while waiting ({type(drop).__name__}: {drop}); reconnecting "
                         f"({attempt + 1}/{RECONNECTS}), the jobs are not resubmitted")
                client.transport.close()
                client = connect()
    except SlurmJobFailed as failure:
        for job_id in ids[ids.index(failure.info.job_id) + 1:]:
            client.cancel(job_id)
        _record_final_states(client, chain, state, state_file)
        raise
    _record_final_states(client, chain, state, state_file)
    evaluator = next(job for job in chain if job.stage == "eval")
    state.evaluation = read_result(client.transport, evaluator.result_file, state.stages["eval"].outs["job_id"])
    publisher = next((job for job in chain if job.stage == "publish"), None)
    if publisher is not None:
        state.publication = read_publication_record(client.transport, publisher, state.stages["publish"].outs["job_id"])
    save_state(state_file, state)
    return state


def read_publication_record(transport: Transport, publisher: JobSpec, job_id: str) -> Publication:
    """What the publish job did, from the record it wrote beside the eval reports."""
    path = f"{publisher.results_path}/{publication_name(job_id)}"
    return read_publication(transport.read_file(path), path)


def _record_final_states(client: SlurmClient, chain: list[JobSpec], state: PipelineState, state_file: Path) -> None:
    """Each job's state, exit code and run time as Slurm has them now, saved to the state file. Not after
    Ctrl-C or a lost link: the jobs run on, and the user wants the prompt back, not more Slurm queries."""
    for job in chain:
        record = state.stages[job.stage]
        info = client.state(record.outs["job_id"])
        record.outs.update({"state": info.state, "exit_code": info.exit_code, "elapsed_s": info.elapsed_s})
    save_state(state_file, state)


def log_file(pattern: str | None, job_id: str) -> str | None:
    """The file Slurm writes for an `--output` pattern: `%j` and `%A` are the job id, `%%` a percent sign."""
    if pattern is None:
        return None
    return re.sub(r"%(%|j|A)", lambda m: "%" if m[1] == "%" else job_id, pattern)


def _public_jobs(state: PipelineState) -> dict[str, dict[str, Any]]:
    keys = ("job_id", "state", "exit_code", "elapsed_s", "output", "results_path")
    return {stage: {**{k: record.outs.get(k) for k in keys},
                    "output": log_file(record.outs.get("output"), record.outs["job_id"])}
            for stage, record in state.stages.items()}


def run_pipeline(
    stack: StackConfig,
    repo_root: Path,
    transport: dict[str, Any],
    *,
    wait: bool,
    serve: bool = False,
    progress: Progress = print,
) -> PipelineRun:
    """Submit what changed; with wait, follow the chain to the end (a failed job raises SlurmJobFailed).
    The stack's lock is held throughout: a second run of the same stack raises StackBusy naming this one."""
    with stack_lock(state_path(repo_root, stack.stack), stack.stack):
        state, result, jobs = submit_chain(stack, repo_root, transport, serve=serve, progress=progress)
        if not wait:
            return result
        if not result.submitted and state.evaluation is not None:
            progress("nothing changed since the last run; its results stand")
            return result
        state = wait_chain(stack, repo_root, transport, jobs, state, progress=progress)
        return result.model_copy(update={"jobs": _public_jobs(state), "evaluation": state.evaluation,
                                          "publication": state.publication})


def node_states(stack: StackConfig, repo_root: Path, transport: dict[str, Any]) -> list[NodeState]:
    """The stack's Slurm nodes now, once each, with their states and reasons."""
    connection = open_transport(transport)
    try:
        states = SlurmClient(connection, env=slurm_env(stack, repo_root)).node_states()
    finally:
        connection.close()
    return once_per_node(states)


def status(stack: StackConfig, repo_root: Path, transport: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The recorded jobs with their live states."""
    state = load_state(state_path(repo_root, stack.stack), stack.stack)
    provider = SlurmJobProvider()
    for record in state.stages.values():
        record.outs["state"] = _live_state(provider, record, {"transport": transport}) or record.outs.get("state")
    return _public_jobs(state)

