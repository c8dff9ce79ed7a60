"""The pipeline's job chain for a stack: which stages run, in what order, from where, with which inputs.

A StackConfig and a RunConfig in, a list of JobSpec out. Two inputs come from this machine: the
workload code's hash (`code_hash` reads the files) and, on the local stack, where it lives (`code_location_for`
reads SLURM_CONF); `pipeline_jobs` itself only computes. The Pulumi program and `ftstack run` both turn
the same specs into SlurmJob submissions, so the two paths cannot drift.

A stage's fingerprint covers the workload code (run configs excluded), only the sections of the
run config that stage reads, and, for stages that read the data, the content fingerprint of a `file:`
data source (infra.pipeline.datasource). Changing the `train` section therefore replaces train and,
through its job id, eval; prepare keeps its job. Replacing the data file replaces prepare and all after it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from documents.evaluator_report import report_name
from documents.metrics import METRICS_NAME
from documents.run_config import RunConfig, RunPaths
from documents.run_plan import PLAN_ENV, RunPlan, SlurmRequest
from planning.catalog import get_platform, get_preset
from infra.config import StackConfig
from infra.environment.plan import EnvironmentPlan, environment_plan
from infra.pipeline.bundle import PACKAGE, bundle_files
from infra.plans import stack_plan
from planning.planner import check_plan
from workloads.common.job_metrics import TEXTFILE_DIR_ENV

Stage = Literal["environment", "prepare", "readiness", "train", "eval", "serve", "publish"]

CHAIN: tuple[Stage, ...] = ("prepare", "readiness", "train", "eval")
DEPENDS_ON: dict[Stage, tuple[Stage, ...]] = {
    "environment": (),
    "prepare": (),
    "readiness": ("prepare",),
    "train": ("readiness",),
    "eval": ("train",),
    "serve": ("train",),
    "publish": ("eval",),
}
SECTIONS: dict[Stage, tuple[str, ...]] = {
    "environment": (),
    "prepare": ("name", "paths", "model", "data"),
    "readiness": ("name", "paths", "readiness"),
    "train": ("name", "paths", "model", "data", "train"),
    "eval": ("name", "paths", "model", "data", "train", "eval"),
    "serve": ("name", "paths", "model", "train", "serve"),
    "publish": ("name", "paths", "model", "train", "eval", "serve"),
}
CONFIGS_DIR = f"{PACKAGE}/configs"
LOCAL_CODE_ROOT = ".local/jail/home/shared/finetune_code"
CLUSTER_CODE_ROOT = "/home/shared/finetune_code"
LOCAL_SLURM_CONF = ".local/slurm/etc/slurm.conf"
LOCAL_TEXTFILE_DIR = ".local/monitoring/textfile"
"""the local node exporter's textfile folder (scripts/local-monitoring.sh), where jobs put their metrics."""


class JobSpec(BaseModel):
    """One stage as the SlurmJob resource and `ftstack run` submit it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: Stage
    script: str
    args: list[str]
    env: dict[str, str]
    extra_args: list[str]
    depends_on: list[Stage]
    fingerprint: str
    output: str
    results_path: str
    metrics_path: str | None = None
    result_file: str | None = None
    time_limit_minutes: int | None = None
    """sbatch --time (planning.time_limits); None: the partition's limit (the server)."""


class CodeLocation(BaseModel):
    """Where the chain runs: the code root on the Slurm machine, the interpreter and the job environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code_root: str
    python: str
    env: dict[str, str]
    slurm_env: dict[str, str]
    environment: EnvironmentPlan | None = None
    """The environment the pipeline builds first (cluster stacks); `python` is its interpreter."""


def code_hash(source_dir: str | Path) -> str:
    """sha256 of the shipped workload code, run configs excluded (first 16 hex digits)."""
    root = Path(source_dir)
    digest = hashlib.sha256()
    for rel in bundle_files(root):
        if rel.as_posix().startswith(CONFIGS_DIR + "/"):
            continue
        digest.update(rel.as_posix().encode() + b"\0")
        digest.update(hashlib.sha256((root / rel).read_bytes()).digest())
    return digest.hexdigest()[:16]


SERVING_NODE_SECTIONS: tuple[str, ...] = ("name", "paths", "model", "serve")
"""what serve reads on workers of its own: not the train section, so a new fine-tune leaves the server running."""


def stage_fingerprint(stage: Stage, code: str, run: RunConfig, data_sha256: str | None = None,
                      sections: tuple[str, ...] | None = None) -> str:
    """What a stage's result depends on: the code, the run config sections it reads (`sections`, default the
    stage's) and the data content."""
    document = run.model_dump(mode="json")
    sliced = {key: document.get(key) for key in (sections or SECTIONS[stage])}
    content = {"data_sha256": data_sha256} if data_sha256 and "data" in SECTIONS[stage] else {}
    payload = json.dumps({"stage": stage, "code": code, "config": sliced, **content}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def slurm_env(stack: StackConfig, repo_root: Path) -> dict[str, str]:
    """What Slurm's tools need in their environment: the local Slurm's config file; nothing elsewhere."""
    if stack.target == "local":
        return {"SLURM_CONF": os.environ.get("SLURM_CONF") or str(repo_root / LOCAL_SLURM_CONF)}
    return {}


def code_location_for(stack: StackConfig, run: RunConfig, repo_root: Path) -> CodeLocation:
    """Local stack: this machine's Slurm, the repo's venv and `.local/`; cloud: the jail seen from login; an
    existing cluster: its jail root, under which a relative `paths.root` of the run config lies."""
    if stack.target == "local":
        root = Path(run.paths.root)
        return CodeLocation(
            code_root=str(repo_root / LOCAL_CODE_ROOT),
            python=str(repo_root / ".venv" / "bin" / "python"),
            env={"FT_ROOT": str(root if root.is_absolute() else (repo_root / root).resolve()),
                 TEXTFILE_DIR_ENV: str(repo_root / LOCAL_TEXTFILE_DIR)},
            slurm_env=slurm_env(stack, repo_root),
        )
    environment = environment_plan(stack)
    python = environment.python if environment is not None else stack.pipeline.python
    if stack.cluster is not None:
        jail = PurePosixPath(stack.cluster.jail_root)
        return CodeLocation(code_root=str(jail / CLUSTER_CODE_ROOT.lstrip("/")), python=python,
                         env={"FT_ROOT": str(jail / run.paths.root)}, slurm_env={}, environment=environment)
    return CodeLocation(code_root=CLUSTER_CODE_ROOT, python=python, env={}, slurm_env={}, environment=environment)


def run_paths_at(run: RunConfig, location: CodeLocation) -> RunPaths:
    """The run's paths on the Slurm machine: under FT_ROOT of the location (local stack), else paths.root."""
    return run.locate(location.env.get("FT_ROOT") or run.paths.root)


def run_root(run: RunConfig, location: CodeLocation) -> Path:
    """The run root as the jobs see it (relative run-config paths resolve against it)."""
    return run_paths_at(run, location).root


def check_run_config_path(run_config_path: str) -> None:
    """Only `workloads/` is shipped to the cluster: a relative run config elsewhere would not be found by
    the jobs, so it is refused before anything is submitted."""
    path = Path(run_config_path)
    if not path.is_absolute() and (not path.parts or path.parts[0] != PACKAGE or ".." in path.parts):
        raise ValueError(f"run config {run_config_path!r} is outside {PACKAGE}/, which is all that is shipped to "
                         f"the cluster: move it under {CONFIGS_DIR}/ (and set pipeline.runConfig to that path), "
                         "or give an absolute path that exists where the jobs run")


def depends_on(stage: Stage, stack: StackConfig) -> tuple[Stage, ...]:
    """A stage's predecessors; with workers reserved for serving, serve needs only the base model (prepare) and
    starts while training runs on the other nodes."""
    if stage == "serve" and stack.serving_on:
        return ("prepare",)
    return DEPENDS_ON[stage]


def serving_stages(stack: StackConfig, run: RunConfig) -> list[Stage]:
    """serve; with workers reserved for serving also publish, which loads the run's fine-tune into the running
    server once its eval passes the gate. That needs an engine that loads adapters at runtime."""
    if not stack.serving_on:
        return ["serve"]
    if run.serve is not None and run.serve.engine == "transformers":
        raise ValueError(f"run config {run.name!r}: serve.engine transformers serves a merged copy and cannot load a "
                         "new fine-tune into the running server; with serving.nodes use engine auto, peft or vllm")
    return ["serve", "publish"]


SERVING_DIR = "serving"
"""under the run root: the serving run store (`store/`) and the gateway's key (`api.key`, mode 0600), which the
serve and publish jobs share."""


def _serving_args(stage: Stage, stack: StackConfig, paths: RunPaths) -> list[str]:
    """serve on its own node starts before the run's fine-tune exists: the base alone (or the set a requeued job
    persisted), listening beyond loopback with a key from the shared key file so that publish, on a training node,
    can load the fine-tune into it; both read the same run store."""
    folder = paths.root / SERVING_DIR
    shared = ["--runs-store", (folder / "store").as_posix(), "--api-key-file", (folder / "api.key").as_posix()]
    if stage == "serve":
        return ["--start-empty", "--resume", "--host", "0.0.0.0", *shared]
    if stage == "publish":
        return ["--stack", stack.stack, *shared]
    return []


def _readiness_expectations(stack: StackConfig) -> list[str]:
    """The worker preset's GPU model, count and memory, for the readiness checks to hold nodes against."""
    if stack.nodes is None or not stack.nodes.workers:
        return []
    first = stack.nodes.workers[0]
    platform = get_platform(first.platform)
    gpus = get_preset(first.platform, first.preset).gpus
    if not platform.is_gpu or gpus == 0:
        return []
    cuda = ["--expect-cuda", stack.cuda_version] if stack.cuda_version else []
    return ["--expect-gpu-model", str(platform.gpu_model), "--expect-gpus-per-node", str(gpus),
            "--expect-gpu-memory-gib", str(platform.gpu_memory_gib), *cuda]


def job_plan(plan: RunPlan) -> RunPlan:
    """What the train job is given of its plan: the requests and the placement, without the time limits, costs,
    notes and serving, so a new throughput measurement, price, job time or stored adapter (which move only the
    estimate and the serve job's rank limit, decided again at its start) replaces no finished job."""
    stages = {name: request.model_copy(update={"time_limit_minutes": None}) for name, request in plan.stages.items()}
    return plan.model_copy(update={"stages": stages, "size": None, "costs": [], "notes": [], "serving": None,
                                   "stage_times_from": None, "tokens_per_second_per_gpu": None})


def pipeline_jobs(
    stack: StackConfig, run: RunConfig, run_config_path: str, code: str, location: CodeLocation, *, serve: bool = False,
    data_sha256: str | None = None, plan: RunPlan | None = None,
) -> list[JobSpec]:
    """The chain prepare -> readiness -> train -> eval (+ serve), each stage with its inputs, submitted from the run's
    `plan` (infra.plans.stack_plan; made without measured inputs when not given): each stage's Slurm request and time
    limit are the plan's, and the train job gets the plan it trains with (PLAN_ENV). A plan the planner refuses
    (planning.planner.refusals) is not submitted."""
    plan = plan or stack_plan(stack, run)
    check_plan(plan)
    check_run_config_path(run_config_path)
    config_arg = Path(run_config_path).as_posix()
    paths = run_paths_at(run, location)
    results_dir, train_dir = paths.results_dir.as_posix(), paths.train_run_dir.as_posix()
    stages: list[Stage] = [*CHAIN, *(serving_stages(stack, run) if serve else [])]
    env = {"FT_PYTHON": location.python, **location.env}
    if location.environment is not None and location.environment.image:
        config_dir = [str(PurePosixPath(config_arg).parent)] if PurePosixPath(config_arg).is_absolute() else []
        run_folders = [paths.model_dir, paths.data_dir, paths.train_model_dir, paths.train_dataset_dir,
                       paths.eval_dataset_dir, paths.checkpoints_dir, paths.train_run_dir, paths.results_dir,
                       *([paths.root / SERVING_DIR] if serve and stack.serving_on else [])]
        used = [location.code_root, location.environment.root, *(p.as_posix() for p in run_folders), *config_dir]
        env.update(container_env(location.environment.image, used))
    jobs = ([environment_job(location.environment, results_dir, run.name, location.code_root,
                             plan.stages["environment"], serve="serve" in stages)]
            if location.environment else [])
    serving = location.environment.serving if location.environment is not None and "serve" in stages else None
    vllm = {"FT_VLLM_PYTHON": serving.python} if serving is not None else {}
    for stage in stages:
        jobs.append(JobSpec(
            stage=stage,
            script=f"{PACKAGE}/jobs/{stage}.sbatch",
            args=[config_arg, *(_readiness_expectations(stack) if stage == "readiness" else []),
                  *(_serving_args(stage, stack, paths) if stack.serving_on else []),
                  *(["--stack", stack.stack] if stage == "serve" else [])],
            env={**env, **vllm} if stage in ("readiness", "serve") else
                {**env, PLAN_ENV: job_plan(plan).model_dump_json()} if stage == "train" else env,
            extra_args=plan.stages[stage].sbatch_args(),
            depends_on=list(depends_on(stage, stack)) or (["environment"] if location.environment else []),
            fingerprint=stage_fingerprint(stage, code, run, data_sha256,
                                          SERVING_NODE_SECTIONS if stage == "serve" and stack.serving_on else None),
            output=f"{results_dir}/logs/{run.name}-{stage}-%j.out",
            results_path=train_dir if stage in ("train", "serve") else results_dir,
            metrics_path=f"{train_dir}/{METRICS_NAME}" if stage == "train" else None,
            result_file=f"{results_dir}/{report_name('{job_id}')}" if stage == "eval" else None,
            time_limit_minutes=plan.stages[stage].time_limit_minutes,
        ))
    return jobs


def container_env(image: str, folders: list[str]) -> dict[str, str]:
    """The job variables that run a stage's steps in `image` through Pyxis (workloads/jobs/container.sh): each jail
    folder the steps use bound at its own path (`SRC:DST`), a folder inside another one covered by it."""
    paths = sorted({PurePosixPath(folder) for folder in folders})
    for path in paths:
        if not path.is_absolute() or path == PurePosixPath("/") or any(c in str(path) for c in ",:"):
            raise ValueError(f"container mount {str(path)!r}: give an absolute folder below / without ',' or ':' "
                             "(Pyxis' --container-mounts=SRC:DST,...)")
    mounts = [str(p) for p in paths if not any(p != q and p.is_relative_to(q) for q in paths)]
    return {"FT_CONTAINER_IMAGE": image, "FT_CONTAINER_MOUNTS": ",".join(f"{m}:{m}" for m in mounts)}


def environment_job(plan: EnvironmentPlan, results_dir: str, run_name: str, code_root: str, request: SlurmRequest,
                    serve: bool = False) -> JobSpec:
    """The first stage: build the environment on one node (`request`: the run plan's, its CPUs and where) from the
    shipped lock (every later job waits for it and runs its interpreter), and when the chain serves (`serve`) on a stack with
    a serving environment, vLLM's after it (the serve job's FT_VLLM_PYTHON); its fingerprint is the environments'
    keys and source, so a second run keeps it."""
    container = container_env(plan.image, [code_root, plan.root]) if plan.image else {}
    serving = [plan.serving.source_dir] if serve and plan.serving is not None else []
    return JobSpec(
        stage="environment", script=f"{PACKAGE}/jobs/environment.sbatch", args=[plan.source_dir, plan.root, *serving],
        env={"FT_PYTHON": plan.base_python, **container},
        extra_args=request.sbatch_args(), depends_on=[],
        fingerprint=plan.build_fingerprint(serve), output=f"{results_dir}/logs/{run_name}-environment-%j.out",
        results_path=plan.folder, time_limit_minutes=request.time_limit_minutes,
    )


def log_dirs(jobs: list[JobSpec]) -> list[str]:
    """Folders Slurm must find before it can open the jobs' output files."""
    return sorted({str(Path(job.output).parent) for job in jobs})


def job_arguments(job: JobSpec, *, bundle_path: Any, dependencies: list[Any], transport: Any,
                  slurm_env: dict[str, str], wait: bool) -> dict[str, Any]:
    """SlurmJob's keyword arguments for a spec (see infra.pipeline.jobs.job_inputs)."""
    return {
        "script": job.script, "bundle_path": bundle_path, "fingerprint": job.fingerprint, "transport": transport,
        "args": job.args, "env": job.env, "dependencies": dependencies, "job_name": f"ft-{job.stage}",
        "output": job.output, "extra_args": job.extra_args, "slurm_env": slurm_env, "wait": wait,
        "metrics_path": job.metrics_path, "results_path": job.results_path, "result_file": job.result_file,
        "poll_s": 2.0, "time_limit_minutes": job.time_limit_minutes,
    }
