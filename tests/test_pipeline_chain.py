"""The job chain: stage fingerprints, placement per stack, and the chain wired in the program's mock run."""

from __future__ import annotations

from pathlib import Path

import pytest

import yaml

from documents.run_config import load_run_config
from documents.soperator_values import SoperatorValues
from planning.catalog import parse_preset
from infra.config import EnvironmentConfig, StackConfig, load_stack_config
from infra.pipeline.chain import CHAIN, JobSpec, code_hash, code_location_for, pipeline_jobs, stage_fingerprint
from infra.program.mocks import run_under_mocks
from infra.soperator.helm_render import kube_version, mirror_beside
from infra.soperator.render import custom_resources, slurm_conf_lines
from infra.soperator.values import operator_values

REPO = Path(__file__).resolve().parents[1]
KEY = {"pipelineSshPrivateKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-key\n-----END OPENSSH PRIVATE KEY-----"}


def _fingerprints(run) -> dict[str, str]:
    return {stage: stage_fingerprint(stage, "code", run) for stage in (*CHAIN, "serve")}


def test_changing_a_section_changes_only_the_stages_that_read_it() -> None:
    run = load_run_config(REPO / "workloads/configs/local.json")
    before = _fingerprints(run)
    new_eval = run.eval.model_copy(update={"num_prompts": run.eval.num_prompts + 1})
    after = _fingerprints(run.model_copy(update={"eval": new_eval}))
    assert {s for s in before if before[s] != after[s]} == {"eval"}
    new_data = run.data.model_copy(update={"rows": run.data.rows + 1})
    after = _fingerprints(run.model_copy(update={"data": new_data}))
    assert {s for s in before if before[s] != after[s]} == {"prepare", "train", "eval"}


def test_code_hash_ignores_run_configs_but_not_code(tmp_path: Path) -> None:
    pkg = tmp_path / "workloads"
    (pkg / "configs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for shipped in ("documents", "planning"):
        (tmp_path / shipped).mkdir()
        (tmp_path / shipped / "__init__.py").write_text("")
    (pkg / "configs" / "a.json").write_text("{}")
    first = code_hash(tmp_path)
    (pkg / "configs" / "a.json").write_text('{"changed": 1}')
    assert code_hash(tmp_path) == first
    (pkg / "stage.py").write_text("print('new code')\n")
    second = code_hash(tmp_path)
    assert second != first
    (tmp_path / "documents" / "report.py").write_text("FIELD = 1\n")
    third = code_hash(tmp_path)
    assert third != second, "the document models ship with the jobs"
    (tmp_path / "planning" / "planner.py").write_text("PLAN = 1\n")
    assert code_hash(tmp_path) != third, "the planner ships with the jobs (the trainer checks its plan with it)"


def test_local_placement_uses_this_repo_and_cloud_uses_the_jail() -> None:
    local = load_stack_config("local", REPO / "stacks")
    run = load_run_config(REPO / local.pipeline.run_config)
    placement = code_location_for(local, run, REPO)
    assert placement.code_root.startswith(str(REPO / ".local"))
    assert placement.env["FT_ROOT"] == str((REPO / run.paths.root).resolve())
    assert placement.python == str(REPO / ".venv" / "bin" / "python")
    demo = load_stack_config("demo", REPO / "stacks")
    cloud = code_location_for(demo, load_run_config(REPO / demo.pipeline.run_config), REPO)
    assert cloud.code_root == "/home/shared/finetune_code" and "FT_ROOT" not in cloud.env


def test_cloud_jobs_spread_over_the_workers_and_check_the_preset() -> None:
    demo = load_stack_config("demo", REPO / "stacks")
    run = load_run_config(REPO / demo.pipeline.run_config)
    jobs = {j.stage: j for j in pipeline_jobs(demo, run, demo.pipeline.run_config, "c", code_location_for(demo, run, REPO))}
    workers = demo.nodes.workers[0]
    assert f"--nodes={workers.size}" in jobs["train"].extra_args and "--ntasks-per-node=1" in jobs["train"].extra_args
    assert "--gpus-per-node=2" in jobs["readiness"].extra_args and "--ntasks-per-node=2" in jobs["readiness"].extra_args
    assert jobs["readiness"].args[jobs["readiness"].args.index("--expect-gpus-per-node") + 1] == "2"
    assert jobs["eval"].result_file.endswith("/evaluator_{job_id}.json")


def _jobs(stack: StackConfig) -> dict[str, JobSpec]:
    run = load_run_config(REPO / stack.pipeline.run_config)
    location = code_location_for(stack, run, REPO)
    return {j.stage: j for j in pipeline_jobs(stack, run, stack.pipeline.run_config, "c", location, serve=True)}


def _cpu_args(job: JobSpec) -> list[str]:
    return [a for a in job.extra_args if a.startswith("--cpus-per-")]


def test_every_cloud_job_asks_for_its_share_of_the_workers_cpus() -> None:
    """Soperator 4.1.7 gives a job that asks nothing one CPU (CR_Core_Memory, no DefCpuPerGPU). The demo workers,
    2gpu-64vcpu-384gb: readiness's two tasks (one per GPU) and eval's GPU get 32 CPUs each; prepare, train's one
    torchrun per node, and serve take the 64 vCPUs the preset's name gives."""
    demo = load_stack_config("demo", REPO / "stacks")
    worker = demo.nodes.workers[0]
    vcpus, gpus = parse_preset(worker.preset).vcpus, parse_preset(worker.preset).gpus
    jobs = _jobs(demo)
    assert _cpu_args(jobs["readiness"]) == [f"--cpus-per-task={vcpus // gpus}"]
    assert _cpu_args(jobs["eval"]) == [f"--cpus-per-gpu={vcpus // gpus}"]
    for stage in ("prepare", "train", "serve"):
        assert _cpu_args(jobs[stage]) == [f"--cpus-per-task={vcpus}"], stage


@pytest.mark.parametrize("stack", ["dev", "demo", "h100"])
def test_the_environment_build_lands_on_a_cpu_node_of_the_system_group(stack: str) -> None:
    """Issue 52: housekeeping never wakes a GPU set. The environment job asks for the housekeeping partition; the
    slurm.conf Soperator 4.1.7 renders from the custom resources Helm makes of the stack's values
    (infra/soperator/render.py) puts only CPU nodes in it, their pods pinned to the system node group, which has no
    GPU; and Soperator's hidden partition, where the active checks send a GPU job to every node, leaves them out."""
    cfg = load_stack_config(stack, REPO / "stacks")
    cfg = cfg.model_copy(update={"pipeline": cfg.pipeline.model_copy(update={
        "environment": EnvironmentConfig(source="index")})})
    args = _jobs(cfg)["environment"].extra_args
    partition = next(a.split("=", 1)[1] for a in args if a.startswith("--partition="))
    values = operator_values(cfg)
    rendered = slurm_conf_lines(custom_resources(SoperatorValues.model_validate(
        {"namespace": cfg.slurm_namespace, "slurmCluster": values.slurm_cluster, "nodesets": values.nodesets}),
        cfg.soperator, mirror=mirror_beside(REPO), kube_version=kube_version(cfg.nebius.k8s_version)))
    partitions = {line.split()[0].removeprefix("PartitionName="): line.split()[1].removeprefix("Nodes=")
                  for line in rendered if line.startswith("PartitionName=")}
    nodesets = {line.split()[0].removeprefix("NodeSet="): line.split()[1].removeprefix("Nodes=")
                for line in rendered if line.startswith("NodeSet=")}
    assert partitions[partition] == "housekeeping" and partition not in partitions["hidden"].split(",")
    nodes = [line for line in rendered if line.startswith("NodeName=housekeeping-")]
    assert nodes and nodesets["housekeeping"] == "housekeeping-0"
    assert all("Gres=" not in line and "Feature=cpu," in line and " CPUs=1" in line for line in nodes)
    assert "--cpus-per-task=1" in args
    housekeeping = next(n for n in values.nodesets if n["name"] == "housekeeping")
    selector = housekeeping["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert selector["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["system"]
    assert cfg.nodes.system.platform.startswith("cpu-") and housekeeping["gpu"] == {"enabled": False}


def test_cluster_jobs_ask_for_the_cpus_per_node_and_local_ones_for_none() -> None:
    cluster = load_stack_config("cluster", REPO / "stacks")
    stack = yaml.safe_load((REPO / "stacks" / "Pulumi.cluster.yaml").read_text())["config"]
    cpus = stack["soperator-finetune:cluster"]["cpusPerNode"]
    assert {stage: _cpu_args(job) for stage, job in _jobs(cluster).items()} == {
        stage: [f"--cpus-per-task={cpus}"] for stage in ("environment", "prepare", "readiness", "train", "eval", "serve")}
    assert all(_cpu_args(job) == [] for job in _jobs(load_stack_config("local", REPO / "stacks")).values())


@pytest.mark.parametrize("stack", ["local", "cluster", "demo"])
def test_the_serve_job_tells_the_launcher_its_stack(stack: str) -> None:
    """Issue 42, item 5: the launcher reads stored runs of the stack it serves only, so the serve job names it."""
    config = load_stack_config(stack, REPO / "stacks")
    run = load_run_config(REPO / config.pipeline.run_config)
    jobs = pipeline_jobs(config, run, config.pipeline.run_config, "c", code_location_for(config, run, REPO), serve=True)
    serve = next(j for j in jobs if j.stage == "serve")
    assert serve.args[1:] == ["--stack", stack]


@pytest.mark.parametrize("stack", ["local", "dev", "demo", "h100"])
def test_mock_run_wires_the_chain_in_order(stack: str) -> None:
    run = run_under_mocks(load_stack_config(stack, REPO / "stacks"), secrets=KEY)
    jobs = {r.name.rsplit("-", 1)[-1]: r for r in run.resources if r.type == "pulumi-python:dynamic:Resource"}
    assert set(jobs) >= {"bundle", *CHAIN}
    for stage, upstream in (("readiness", "prepare"), ("train", "readiness"), ("eval", "train")):
        assert jobs[upstream].urn in jobs[stage].dependencies, f"{stage} does not wait for {upstream}"
        assert jobs[stage].inputs["dependencies"] == [f"{jobs[upstream].name}-job"]
    if stack == "local":
        assert jobs["prepare"].inputs["dependencies"] == [] and "environment" not in jobs
    else:
        assert jobs["prepare"].inputs["dependencies"] == [f"{jobs['environment'].name}-job"]
        assert jobs["environment"].inputs["dependencies"] == []
        assert jobs["source"].urn in jobs["environment"].dependencies, "the lock is shipped before the build"
        built = jobs["environment"].inputs["results_path"]
        assert all(jobs[s].inputs["env"]["FT_PYTHON"] == f"{built}/bin/python" for s in CHAIN)
        assert jobs["environment"].inputs["env"]["FT_PYTHON"] == "python3"
    assert all(jobs["bundle"].urn in jobs[s].dependencies for s in CHAIN)
    assert jobs["train"].inputs["transport"] == "[secret]" or stack == "local"
    if stack != "local":
        releases = {r.urn for r in run.resources if r.type == "kubernetes:helm.sh/v3:Release"}
        assert releases <= set(jobs["bundle"].dependencies)


def test_train_section_folders_move_the_chain_paths_with_them() -> None:
    demo = load_stack_config("demo", REPO / "stacks")
    run = load_run_config(REPO / demo.pipeline.run_config)
    moved = run.model_copy(update={"train": run.train.model_copy(update={
        "output_dir": "/mnt/model/elsewhere", "dataset_dir": "/mnt/data/tok", "checkpoint_dir": "/mnt/chkpt/x"})})
    jobs = {j.stage: j for j in pipeline_jobs(demo, moved, demo.pipeline.run_config, "c", code_location_for(demo, moved, REPO))}
    assert jobs["train"].metrics_path == "/mnt/model/elsewhere/metrics.jsonl"
    assert jobs["train"].results_path == "/mnt/model/elsewhere"
    paths = moved.locate("/")
    assert (paths.adapter_dir, paths.merged_dir) == (Path("/mnt/model/elsewhere/adapter"), Path("/mnt/model/elsewhere/merged"))
    assert paths.train_dataset_dir == Path("/mnt/data/tok") and paths.train_tokenized_dir != paths.train_dataset_dir
    assert paths.checkpoints_dir == Path("/mnt/chkpt/x")
