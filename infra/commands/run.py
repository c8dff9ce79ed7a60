"""`ftstack run --stack NAME [--wait]`: ship the workload code and submit the pipeline without the Pulumi engine.

The same bundle upload and SlurmJob provider as `pulumi up`, driven from a state file under
`.local/pipeline/`. Local stack: this machine's Slurm. Cloud stacks: SSH to the login node
(`--login-host`/FT_LOGIN_HOST, key from `--ssh-key FILE` or FT_SSH_PRIVATE_KEY).
With --wait it follows the chain to the end, writes the run's flat outputs, and stores its artifacts.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from documents.adapter_registry import SERVED_SET_NAME, ServedSet, read_served_set
from documents.atomic import write_text_atomic
from documents.base import DocumentError
from documents.environment_manifest import ENVIRONMENT_MANIFEST_NAME, EnvironmentManifest, read_environment_manifest
from documents.evaluator_report import report_name
from documents.metrics import METRICS_NAME, read_metrics
from documents.prepare_summary import SUMMARY_NAME, PrepareSummary, read_prepare_summary
from documents.run_config import ConfigError, load_run_config
from documents.run_manifest import RUN_MANIFEST_NAME, read_run_manifest
from documents.run_record import RunIndex
from documents.stack_outputs import StackOutputs, write_stack_outputs
from documents.throughput import ThroughputCheck, ThroughputMeasurement, measure_run
from infra.config import StackConfig, StackConfigError, find_repo_root, load_run, load_stack_config, stack_file
from infra.cost.price import CostReport, PriceInputs, price_stack
from infra.cost.render import render_chat_table
from planning.workers import stack_gpu_model
from infra.environment.plan import environment_plan, environment_section
from infra.pipeline.connect import open_transport
from infra.pipeline.fetch import fetch_run
from infra.pipeline.run_lock import StackBusy
from infra.pipeline.runner import PipelineRun, load_state, run_pipeline, state_path, transport_spec
from infra.pipeline.slurm import SlurmError
from infra.pipeline.transport import TransportError
from infra.cost.sections import serving_section
from infra.output_sections import pipeline_section, served_speeds, stack_identity
from infra.run_sources import check_stack_run
from infra.runs.measured import price_inputs, runs_of
from infra.runs.store import ARTIFACTS_BUCKET_ENV, ArtifactError, RunStore, list_runs, store_for_stack, upload_run


def add_transport_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", required=True, help="stack name (stacks/Pulumi.<stack>.yaml)")
    parser.add_argument("--config-dir", default="stacks", help="directory of the stack files (default: stacks)")
    parser.add_argument("--login-host", default=os.environ.get("FT_LOGIN_HOST"), help="login node address (cloud)")
    parser.add_argument("--ssh-key", type=Path, help="pipeline SSH private key file (cloud; or FT_SSH_PRIVATE_KEY)")
    parser.add_argument("--known-hosts", help="known_hosts file for the login host key (default ~/.ssh/known_hosts)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", help="submit the pipeline through the stack's transport (no Pulumi engine)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_transport_arguments(parser)
    parser.add_argument("--wait", action="store_true", help="follow the jobs to the end (progress on stderr)")
    parser.add_argument("--serve", action="store_true", help="also submit the serve job (or pipeline.serve)")
    parser.add_argument("--json", action="store_true", help="print the run (jobs, evaluation) as JSON")
    parser.add_argument("--cost-stack", help="price cost per chat on this stack (default: the stack itself; "
                        "the local stack has no cloud cost, so `make demo` prices on `demo`)")
    parser.set_defaults(func=run)


def open_spec(args: argparse.Namespace, stack: StackConfig) -> dict[str, Any]:
    key = args.ssh_key.read_text() if args.ssh_key else os.environ.get("FT_SSH_PRIVATE_KEY")
    return transport_spec(stack, login_host=args.login_host, private_key=key, known_hosts=args.known_hosts,
                          repo_root=find_repo_root())


def run_outputs(stack: StackConfig, cost: CostReport, result: PipelineRun, served: ServedSet | None = None,
                built: EnvironmentManifest | None = None) -> StackOutputs:
    """The run as stack outputs (the README's stack outputs contract), as the program writes them; with the
    server's adapters when it reported them and the environment's build once it is built."""
    plan = environment_plan(stack)
    return StackOutputs(**stack_identity(stack), cost=cost.section(),
                        pipeline=pipeline_section(result.bundle_hash, result.jobs, result.evaluation),
                        environment=environment_section(plan, built) if plan is not None else None,
                        serving=serving_section(cost.adapter_chats, served) if served else None)


def built_environment(stack: StackConfig, spec: dict[str, Any]) -> EnvironmentManifest | None:
    """The manifest of the stack's environment on the cluster, None before it is built (or unreadable)."""
    plan = environment_plan(stack)
    if plan is None:
        return None
    path = f"{plan.folder}/{ENVIRONMENT_MANIFEST_NAME}"
    try:
        return read_environment_manifest(open_transport(spec).read_file(path), path)
    except (TransportError, OSError, DocumentError):
        return None


def local_served_set(stack: StackConfig, repo: Path) -> ServedSet | None:
    """The local server's served set (`served_adapters.json` in the run's results folder), if it wrote one."""
    if stack.target != "local":
        return None
    path = load_run_config(repo / stack.pipeline.run_config).results_dir / SERVED_SET_NAME
    return read_served_set(path.read_bytes(), str(path)) if path.is_file() else None


def outputs_path(repo: Path, stack_name: str) -> Path:
    return state_path(repo, stack_name).with_name(f"{stack_name}-outputs.json")


def write_outputs(path: Path, outputs: StackOutputs) -> None:
    write_text_atomic(path, write_stack_outputs(outputs))


def stored_run(store: RunStore, stack: StackConfig, result: PipelineRun) -> RunIndex | None:
    """The stored run of this pipeline's eval job, if it was stored already."""
    eval_job = result.jobs["eval"]["job_id"]
    return next((r for r in list_runs(store, stack.stack) if r.job_ids.get("eval") == eval_job), None)


def run_folders(stack: StackConfig, result: PipelineRun, spec: dict[str, Any], dest: Path) -> dict[str, Path]:
    """The finished run's train and results folders on this machine: the run config's own on the local stack;
    else fetched through the transport (SSH to the login node) under `dest`."""
    if stack.target == "local":
        return {}
    train_dir, results_dir = fetch_run(open_transport(spec), result.jobs["train"]["results_path"],
                                       result.jobs["eval"]["results_path"], result.jobs["eval"]["job_id"], dest)
    return {"train_run_dir": train_dir, "results_dir": results_dir}


def measured_throughput(stack: StackConfig, repo: Path, folders: dict[str, Path], run_id: str
                        ) -> ThroughputMeasurement | None:
    """What the run's training records say it ran at (None when it logged no timed step or left no manifest)."""
    train_dir = folders.get("train_run_dir") or load_run_config(repo / stack.pipeline.run_config).train_run_dir
    manifest_file, metrics_file = train_dir / RUN_MANIFEST_NAME, train_dir / METRICS_NAME
    if not manifest_file.is_file() or not metrics_file.is_file():
        return None
    manifest = read_run_manifest(manifest_file.read_bytes(), str(manifest_file))
    records = read_metrics(metrics_file.read_bytes(), str(metrics_file))
    return measure_run(records, manifest, gpu_model=stack_gpu_model(stack.plan_stack()), stack_name=stack.stack,
                       run_id=run_id, source=f"ftstack run --stack {stack.stack}")


def new_run_id(result: PipelineRun) -> str:
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{result.jobs['eval']['job_id']}"


def _upload(store: RunStore, stack: StackConfig, repo: Path, result: PipelineRun, run_id: str,
            folders: dict[str, Path], outputs: StackOutputs, throughput: ThroughputMeasurement | None,
            check: ThroughputCheck | None) -> str:
    uploaded = upload_run(
        store, stack.stack, run_id, repo / stack.pipeline.run_config, **folders,
        job_ids={s: j["job_id"] for s, j in result.jobs.items()},
        job_states={s: j["state"] for s, j in result.jobs.items()},
        job_durations_s={s: j["elapsed_s"] for s, j in result.jobs.items() if j["elapsed_s"] is not None},
        started_at=result.started_at,
        finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        outputs=outputs, throughput=throughput, throughput_check=check,
    )
    return uploaded.store


def throughput_check(before: CostReport, measured: ThroughputMeasurement) -> ThroughputCheck | None:
    """The run's measurement against the figure the stack was priced with before it (None when it had none)."""
    t = before.training
    if t is None or t.tokens_per_second_per_gpu is None:
        return None
    return ThroughputCheck.of(t.tokens_per_second_per_gpu, t.throughput_kind, t.throughput_source,
                              measured.tokens_per_second_per_device)


def finish_run(stack: StackConfig, repo: Path, result: PipelineRun, spec: dict[str, Any], inputs: PriceInputs,
               served: ServedSet | None = None, built: EnvironmentManifest | None = None
               ) -> tuple[StackOutputs, CostReport, str | None]:
    """After a finished pipeline: bring its records back, price the stack with the throughput the run measured
    (with the figure it was priced with before kept beside it in the run record), write the outputs and store
    the artifacts (once per eval job). Returns the outputs, the price and where the artifacts went."""
    store = store_for_stack(stack, repo) if stack.target != "nebius" or os.environ.get(ARTIFACTS_BUCKET_ENV) else None
    stored = stored_run(store, stack, result) if store is not None else None
    if stored is not None:
        if stored.throughput is not None:
            inputs = inputs.model_copy(update={"training": stored.throughput,
                                               "training_read_from": runs_of(store, stack.stack)})
        report = price_stack(stack, inputs, load_run(stack, repo))
        return run_outputs(stack, report, result, served, built), report, None
    with tempfile.TemporaryDirectory(prefix="ft-fetch-") as tmp:
        folders = run_folders(stack, result, spec, Path(tmp))
        run_id = new_run_id(result)
        throughput = measured_throughput(stack, repo, folders, run_id)
        run = load_run(stack, repo)
        report, check = price_stack(stack, inputs, run), None
        if throughput is not None:
            check = throughput_check(report, throughput)
            report = price_stack(stack, inputs.model_copy(update={
                "training": throughput, "training_read_from": runs_of(store, stack.stack) if store else None,
                "training_note": None}), run)
        outputs = run_outputs(stack, report, result, served, built)
        where = _upload(store, stack, repo, result, run_id, folders, outputs, throughput, check) \
            if store is not None else None
    return outputs, report, where


def run(args: argparse.Namespace) -> int:
    repo = find_repo_root()
    try:
        stack = load_stack_config(args.stack, repo / args.config_dir)
        cost_stack = cost_stack_config(args.cost_stack, repo, repo / args.config_dir) if args.cost_stack else stack
        check_stack_run(stack, repo)
        spec = open_spec(args, stack)
        result = run_pipeline(stack, repo, spec, wait=args.wait, serve=args.serve or stack.pipeline.serve,
                              progress=lambda line: print(line, file=sys.stderr, flush=True))
    except (StackConfigError, ConfigError, ValueError, SlurmError, TransportError, OSError, StackBusy) as error:
        print(f"ftstack run: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(interrupted_text(repo, args), file=sys.stderr)
        return 130
    path = outputs_path(repo, stack.stack)
    prepare = read_prepare(spec, result) if args.wait else None
    served = local_served_set(stack, repo)
    built = built_environment(stack, spec) if args.wait else None
    inputs = price_inputs(stack, repo).with_evaluation(result.evaluation).model_copy(
        update={"prepared": prepare.summary if prepare is not None else None, "served_speeds": served_speeds(served)})
    if timed := {s: float(j["elapsed_s"]) for s, j in result.jobs.items() if j["elapsed_s"] is not None}:
        inputs = inputs.model_copy(update={"stage_seconds": timed, "stage_seconds_from": "this run"})
    if args.wait and result.evaluation is not None:
        try:
            outputs, report, where = finish_run(stack, repo, result, spec, inputs, served, built)
        except (ArtifactError, TransportError, DocumentError) as error:
            write_outputs(path, run_outputs(stack, price_stack(stack, inputs, load_run(stack, repo)), result, served, built))
            print(f"ftstack run: artifacts not stored (local copies kept): {error}", file=sys.stderr)
            return 1
        if where:
            print(f"artifacts stored in {where}", file=sys.stderr)
    else:
        report = price_stack(stack, inputs, load_run(stack, repo))
        outputs = run_outputs(stack, report, result, served, built)
    write_outputs(path, outputs)
    print(f"outputs written to {path}", file=sys.stderr)
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    for stage, job in result.jobs.items():
        elapsed = f"{job['elapsed_s']}s" if job["elapsed_s"] is not None else "-"
        print(f"{stage:<10} job {job['job_id']:<8} {job['state']:<12} {elapsed}")
    if prepare is not None:
        print(prepare.text())
    if result.evaluation is not None:
        cost = report if cost_stack is stack else \
            price_stack(cost_stack, price_inputs(cost_stack, repo).with_evaluation(result.evaluation),
                        load_run(cost_stack, repo))
        print(evaluation_summary_text(stack, result, cost_stack, cost))
    if result.publication is not None:
        print(result.publication.text())
    return 0


def cost_stack_config(name: str, repo: Path, config_dir: Path) -> StackConfig:
    """The stack to price on: from `config_dir` when its file is there, else from the repository's stacks/
    (a user's own stack folder need not copy the shipped cloud stacks)."""
    folder = config_dir if stack_file(name, config_dir).is_file() else repo / "stacks"
    return load_stack_config(name, folder)


@dataclass(frozen=True)
class PrepareRead:
    """The prepare stage's prepare.json as read once through the stack's transport, or why it could not be."""

    path: str
    summary: PrepareSummary | None
    error: str | None = None

    def text(self) -> str:
        """Where the rows went in the prepare stage, one line per step."""
        if self.summary is None:
            return f"\ndata: no prepare summary ({self.error})"
        return "\n".join([f"\nData ({self.path}):", *(f"  {line}" for line in self.summary.lines())])


def read_prepare(spec: dict[str, Any], result: PipelineRun) -> PrepareRead | None:
    """The run's prepare summary (shown after the jobs; the data size the training run is priced on), None when
    the run has no prepare job."""
    if "prepare" not in result.jobs:
        return None
    path = f"{result.jobs['prepare']['results_path']}/{SUMMARY_NAME}"
    try:
        return PrepareRead(path, read_prepare_summary(open_transport(spec).read_file(path), path))
    except (TransportError, OSError, DocumentError) as error:
        return PrepareRead(path, None, str(error))


def again_flags(args: argparse.Namespace, run_flags: bool) -> str:
    """The flags a command after this one needs to reach the same stack the same way (`--stack`, the stack
    files' folder, the login node, the SSH key), and with `run_flags` those that change what `ftstack run` does."""
    given = [("--stack", args.stack), ("--config-dir", args.config_dir if args.config_dir != "stacks" else None),
             ("--login-host", args.login_host if args.login_host != os.environ.get("FT_LOGIN_HOST") else None),
             ("--ssh-key", args.ssh_key), ("--known-hosts", args.known_hosts)]
    if run_flags:
        given += [("--serve", args.serve or None), ("--cost-stack", args.cost_stack)]
    return " ".join(flag if value is True else f"{flag} {shlex.quote(str(value))}"
                    for flag, value in given if value is not None)


def interrupted_text(repo: Path, args: argparse.Namespace) -> str:
    """What Ctrl-C left behind: the submitted jobs go on in Slurm; how to follow them or wait again."""
    stack = args.stack
    try:
        jobs = {name: record.outs["job_id"] for name, record in load_state(state_path(repo, stack), stack).stages.items()}
    except ValueError:
        jobs = {}
    listed = ", ".join(f"{name} {job}" for name, job in jobs.items()) or "none recorded yet"
    return (f"\nftstack run: interrupted. Submitted jobs keep running in Slurm ({listed}); nothing was cancelled.\n"
            f"  follow them:   ftstack status {again_flags(args, False)}\n"
            f"  wait again:    ftstack run {again_flags(args, True)} --wait   (resubmits nothing that is unchanged)\n"
            f"  stop them:     scancel <job id>")


def evaluation_summary_text(stack: StackConfig, result: PipelineRun, cost_stack: StackConfig, cost: CostReport
                            ) -> str:
    """The evaluator's comparison block and the cost-per-chat table with the measured throughput."""
    assert result.evaluation is not None
    eval_job = result.jobs["eval"]
    path = f"{eval_job['results_path']}/{report_name(eval_job['job_id'])}"
    lines = [f"\nEvaluation ({path}), fine-tuned side: {result.evaluation.finetuned_kind}", "comparison:",
             result.evaluation.comparison.model_dump_json(indent=2)]
    measured = cost.measured_chat
    if measured is None:
        lines.append(f"\nstack {cost_stack.stack!r} has no cloud cost; price cost per chat with --cost-stack demo")
        return "\n".join(lines)
    lines += [f"\nOn stack {cost_stack.stack!r} (monthly ${cost.monthly.usd_high:,.0f}); 'measured' is the "
              f"fine-tuned model's generation speed in this run ({stack.stack} stack):",
              render_chat_table([*cost.chats, measured])]
    return "\n".join(lines)
