"""The `container` environment source: every job's Python step runs in the stack's image through Pyxis.

Pyxis (a Slurm SPANK plugin) cannot be installed here, so what is checked is the command each job gives `srun`:
the chain's job variables, and the job scripts run by bash with a test-only `srun` on PATH that records its
arguments and runs the command after srun's own options on this host (no container). The expected flags are
those of Pyxis' README at v0.24.0: `--container-image=IMAGE`, `--container-mounts=SRC:DST[,SRC:DST...]`,
`--container-workdir=PATH`, `--no-container-mount-home`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from documents.run_config import load_run_config
from infra.config import EnvironmentConfig, StackConfig, load_stack_config
from infra.pipeline.chain import container_env, pipeline_jobs, code_location_for

REPO = Path(__file__).resolve().parents[1]
IMAGE = "nvcr.io#nvidia/pytorch:25.10-py3"
PYXIS_FLAGS = ("--container-image=", "--container-mounts=", "--container-workdir=", "--no-container-mount-home")
SRUN_SHIM = """#!/usr/bin/env bash
# test-only srun: record the arguments (one JSON line), then run the command after srun's options on this host
"$SHIM_PYTHON" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$SHIM_LOG"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
if [[ "$*" =~ $SHIM_RUN ]]; then exec "$@"; fi
"""


def _with_environment(stack: StackConfig, environment: EnvironmentConfig) -> StackConfig:
    return stack.model_copy(update={"pipeline": stack.pipeline.model_copy(update={"environment": environment})})


def _jobs(stack: StackConfig):
    run = load_run_config(REPO / stack.pipeline.run_config)
    placement = code_location_for(stack, run, REPO)
    return placement, pipeline_jobs(stack, run, stack.pipeline.run_config, "code", placement, serve=True)


def test_a_container_stack_runs_every_job_in_the_image_with_the_jail_folders_bound_at_their_paths() -> None:
    demo = _with_environment(load_stack_config("demo", REPO / "stacks"), EnvironmentConfig(source="container",
                                                                                          image=IMAGE))
    placement, jobs = _jobs(demo)
    assert [job.stage for job in jobs] == ["environment", "prepare", "readiness", "train", "eval", "serve"]
    # demo.json: model_dir /mnt/model (output_dir /mnt/model/runs inside it), data_dir /mnt/data/demo (results
    # inside it), checkpoint_dir /mnt/chkpt (the run's checkpoints in <checkpoint_dir>/<name>)
    run_folders = {"/mnt/model", "/mnt/data/demo", "/mnt/chkpt/demo"}
    code_and_envs = {"/home/shared/finetune_code", "/home/shared/finetune_env"}
    for job in jobs:
        assert job.env["FT_CONTAINER_IMAGE"] == IMAGE
        pairs = [mount.split(":") for mount in job.env["FT_CONTAINER_MOUNTS"].split(",")]
        assert all(src == dst for src, dst in pairs), "each folder appears inside at the path the jail gives it"
        wanted = code_and_envs if job.stage == "environment" else code_and_envs | run_folders
        assert {src for src, _ in pairs} == wanted, job.stage
    env_python = placement.environment.python
    assert env_python.startswith("/home/shared/finetune_env/")
    assert {job.env["FT_PYTHON"] for job in jobs[1:]} == {env_python}


@pytest.mark.parametrize("stack", ["demo", "cluster", "local"])
def test_stacks_of_other_sources_set_no_container_variable(stack: str) -> None:
    _, jobs = _jobs(load_stack_config(stack, REPO / "stacks"))
    assert all(not key.startswith("FT_CONTAINER") for job in jobs for key in job.env)


@pytest.mark.parametrize("folder", ["/", "relative/run", "/mnt/a,b", "/mnt/a:b"])
def test_a_folder_pyxis_cannot_bind_at_its_path_is_refused(folder: str) -> None:
    with pytest.raises(ValueError, match="container mount"):
        container_env(IMAGE, ["/home/shared/finetune_code", folder])


@pytest.fixture
def shim(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN_SHIM)
    (bin_dir / "srun").chmod(0o755)
    (tmp_path / "slurm.conf").write_text("ClusterName=shim\nSlurmctldHost=localhost\n")
    mounts = [str(REPO), str(tmp_path / "env"), str(tmp_path / "run")]
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SHIM_LOG": str(tmp_path / "srun.log"),
            "SHIM_PYTHON": str(REPO / ".venv/bin/python"), "SHIM_RUN": "^$", "SLURM_CONF": str(tmp_path / "slurm.conf"),
            "FT_CODE_DIR": str(REPO), "FT_ROOT": str(tmp_path / "run"), "FT_PYTHON": str(REPO / ".venv/bin/python"),
            "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
            "FT_CONTAINER_IMAGE": IMAGE, "FT_CONTAINER_MOUNTS": ",".join(f"{m}:{m}" for m in mounts)}


def _run(script: str, args: list[str], env: dict[str, str]) -> list[list[str]]:
    proc = subprocess.run(["bash", f"workloads/jobs/{script}", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in Path(env["SHIM_LOG"]).read_text().splitlines()]


def _run_no_log(script: str, env: dict[str, str]) -> list[str]:
    proc = subprocess.run(["bash", f"workloads/jobs/{script}", "workloads/configs/local.json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    log = Path(env["SHIM_LOG"])
    return log.read_text().splitlines() if log.exists() else []


def _split(call: list[str]) -> tuple[list[str], list[str]]:
    """(srun's options, the command)."""
    first = next(i for i, arg in enumerate(call) if not arg.startswith("-"))
    return call[:first], call[first:]


def _assert_in_image(options: list[str], env: dict[str, str]) -> None:
    assert f"--container-image={IMAGE}" in options
    assert f"--container-mounts={env['FT_CONTAINER_MOUNTS']}" in options
    assert f"--container-workdir={REPO}" in options and "--no-container-mount-home" in options


@pytest.mark.parametrize(("script", "module"), [
    ("prepare.sbatch", "workloads.prepare"), ("eval.sbatch", "workloads.eval.evaluate"),
    ("serve.sbatch", "workloads.serve.launcher.launch"), ("readiness.sbatch", "workloads.checks.gpu"),
])
def test_each_single_step_job_puts_its_python_step_in_the_image(script: str, module: str,
                                                                shim: dict[str, str], tmp_path: Path) -> None:
    [call] = _run(script, ["workloads/configs/local.json"], shim)
    options, command = _split(call)
    _assert_in_image(options, shim)
    assert command == [shim["FT_PYTHON"], "-m", module, "--config", str(REPO / "workloads/configs/local.json")]
    assert (tmp_path / "env").is_dir() and (tmp_path / "run").is_dir(), "the bound folders exist before the step"


def test_train_runs_the_launch_one_torchrun_per_node_and_the_export_in_the_image(shim: dict[str, str]) -> None:
    env = {**shim, "SHIM_RUN": "workloads.train.launch"}
    calls = _run("train.sbatch", ["workloads/configs/local.json"], env)
    assert len(calls) == 3
    for call in calls:
        _assert_in_image(_split(call)[0], env)
    (launch_opts, launch), (torch_opts, torchrun), (export_opts, export) = (_split(call) for call in calls)
    assert launch[1:3] == ["-m", "workloads.train.launch"] and export[1:3] == ["-m", "workloads.train.export"]
    assert {"--nodes=1", "--ntasks=1"} <= set(launch_opts) and {"--nodes=1", "--ntasks=1"} <= set(export_opts)
    assert {"--nodes=2", "--ntasks-per-node=1"} <= set(torch_opts), "one container (one torchrun) per node"
    assert torchrun[1:3] == ["-m", "torch.distributed.run"]
    assert "--nnodes=2" in torchrun and "--rdzv_endpoint=node1:29500" in torchrun


def test_the_environment_build_runs_in_the_image(shim: dict[str, str], tmp_path: Path) -> None:
    [call] = _run("environment.sbatch", [str(tmp_path / "env/sources/k"), str(tmp_path / "env")], shim)
    options, command = _split(call)
    _assert_in_image(options, shim)
    assert command[1:3] == ["-m", "workloads.environment.build"]


def test_without_an_image_no_step_goes_through_srun(shim: dict[str, str]) -> None:
    env = {key: value for key, value in shim.items() if not key.startswith("FT_CONTAINER")}
    env["FT_PYTHON"] = "true"
    assert _run_no_log("prepare.sbatch", env) == []
