"""SlurmJob: one pipeline stage submitted to Slurm, as a Pulumi dynamic resource.

Inputs: the stage's sbatch script (relative to the bundle), its args and environment, its fingerprint
(what its result depends on, see infra.pipeline.chain.stage_fingerprint) and the ids of the jobs it
depends on. Any change of these replaces the job, and through the dependency ids every job after
it. The bundle path is where a new submission runs from; a newer upload alone replaces nothing. Create submits (and optionally waits); refresh
reads the live state; delete cancels a queued or running job and never deletes its outputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult

from documents.evaluator_report import EvaluatorReport, read_evaluator_report
from infra.pipeline.connect import open_transport
from infra.pipeline.slurm import JobInfo, SlurmClient
from infra.pipeline.transport import Transport
from infra.dynamic_resource import DynamicResource

REPLACING = ("script", "args", "env", "fingerprint", "dependencies", "job_name", "output",
             "extra_args", "transport", "slurm_env")
_RESULT_KEYS = ("job_id", "state", "exit_code", "elapsed_s")


@contextmanager
def _client(props: dict[str, Any]) -> Iterator[SlurmClient]:
    """A Slurm client over the props' transport, closed after use: a long-lived process (the Automation API, a
    test session) keeps no SSH session open to the login node per resource it touched."""
    transport = open_transport(props["transport"])
    try:
        yield SlurmClient(transport, env=props.get("slurm_env") or {}, poll_s=float(props.get("poll_s") or 5.0))
    finally:
        transport.close()


def _result(info: JobInfo) -> dict[str, Any]:
    return {"job_id": info.job_id, "state": info.state, "exit_code": info.exit_code, "elapsed_s": info.elapsed_s}


def submit_stage(props: dict[str, Any]) -> dict[str, Any]:
    """sbatch the stage from the bundle folder (FT_CODE_DIR) after its dependencies; wait if asked."""
    with _client(props) as client:
        return _submit_stage(client, props)


def _submit_stage(client: SlurmClient, props: dict[str, Any]) -> dict[str, Any]:
    bundle = props["bundle_path"].rstrip("/")
    job_id = client.submit(
        f"{bundle}/{props['script']}",
        list(props.get("args") or []),
        job_name=props.get("job_name"),
        dependencies=[str(d) for d in props.get("dependencies") or []],
        output=props.get("output"),
        workdir=bundle,
        extra_args=sbatch_extra_args(props),
        env={"FT_CODE_DIR": bundle, "FT_AFTER_JOBS": ",".join(str(d) for d in props.get("dependencies") or []),
             **(props.get("env") or {})},
    )
    if props.get("wait"):
        info = client.wait(job_id, timeout=props.get("wait_timeout"), metrics_path=props.get("metrics_path"))
        report = read_result(client.transport, props.get("result_file"), job_id)
        return {**_result(info), **({"result": report.model_dump(mode="json")} if report is not None else {})}
    return _result(client.state(job_id))


def sbatch_extra_args(props: dict[str, Any]) -> list[str]:
    """The stage's own sbatch arguments: its placement and, where it has one, its time limit (--time)."""
    minutes = props.get("time_limit_minutes")
    return [*(props.get("extra_args") or []), *([f"--time={minutes}"] if minutes else [])]


def read_result(transport: Transport, result_file: str | None, job_id: str) -> EvaluatorReport | None:
    """The report a finished job wrote to result_file ("{job_id}" filled in), if the stage has one."""
    if not result_file:
        return None
    path = result_file.format(job_id=job_id)
    return read_evaluator_report(transport.read_file(path), path)


def job_report(result: dict[str, Any] | None) -> EvaluatorReport | None:
    """The typed report back from a SlurmJob's `result` output (the report as read_result returned it).
    A result recorded before the report was typed held only a summary: it counts as none (the next waited
    run reads the report again)."""
    if not result or "base_model" not in result:
        return None
    return EvaluatorReport.model_validate(result)


class SlurmJobProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = submit_stage(props)
        return CreateResult(id_=outs["job_id"], outs={**props, **outs})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        if "fingerprint" not in olds and "bundle_hash" in olds:
            olds = {**olds, "fingerprint": olds["bundle_hash"]}  # the input's name in state written before 2026-11
        replaces = [k for k in REPLACING if (olds.get(k) or None) != (news.get(k) or None)]
        others = [k for k in ("wait", "wait_timeout", "metrics_path", "results_path", "result_file", "poll_s",
                              "time_limit_minutes") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(replaces or others), replaces=replaces, delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        outs = {**news, **{k: olds.get(k) for k in (*_RESULT_KEYS, "result")}}
        if news.get("wait") and olds.get("job_id"):
            with _client(news) as client:
                outs.update(_result(client.wait(olds["job_id"], timeout=news.get("wait_timeout"),
                                                metrics_path=news.get("metrics_path"))))
        return UpdateResult(outs=outs)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        with _client(props) as client:
            return ReadResult(id_=id_, outs={**props, **_result(client.state(id_))})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        with _client(props) as client:
            client.cancel(id_)


def job_inputs(
    *,
    script: str,
    bundle_path: pulumi.Input[str],
    fingerprint: pulumi.Input[str],
    transport: pulumi.Input[dict],
    args: pulumi.Input[list] | None = None,
    env: pulumi.Input[dict] | None = None,
    dependencies: pulumi.Input[list] | None = None,
    job_name: str | None = None,
    output: str | None = None,
    extra_args: list[str] | None = None,
    slurm_env: dict | None = None,
    wait: bool = False,
    wait_timeout: float | None = None,
    metrics_path: str | None = None,
    results_path: str | None = None,
    result_file: str | None = None,
    poll_s: float | None = None,
    time_limit_minutes: int | None = None,
) -> dict[str, Any]:
    """The provider's inputs, with the outputs it fills in set to None (SlurmJob and `ftstack run` share it)."""
    return {
        "script": script, "bundle_path": bundle_path, "fingerprint": fingerprint, "transport": transport,
        "args": args or [], "env": env or {}, "dependencies": dependencies or [], "job_name": job_name,
        "output": output, "extra_args": extra_args or [], "slurm_env": slurm_env or {}, "wait": wait,
        "wait_timeout": wait_timeout, "metrics_path": metrics_path, "results_path": results_path,
        "result_file": result_file, "poll_s": poll_s, "time_limit_minutes": time_limit_minutes, "result": None,
        **{k: None for k in _RESULT_KEYS},
    }


class SlurmJob(DynamicResource):
    """A submitted stage; outputs job_id, state, exit_code, elapsed_s, results_path and, for a waited
    job with a result_file, `result` (the evaluator report; `job_report` types it). Keyword arguments: see
    job_inputs."""

    job_id: pulumi.Output[str]
    state: pulumi.Output[str]
    exit_code: pulumi.Output[int | None]
    elapsed_s: pulumi.Output[int | None]
    results_path: pulumi.Output[str | None]
    result: pulumi.Output[dict | None]

    def __init__(self, name: str, *, opts: pulumi.ResourceOptions | None = None, **inputs: Any) -> None:
        super().__init__(
            SlurmJobProvider(), name, job_inputs(**inputs),
            pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["transport"])),
        )
