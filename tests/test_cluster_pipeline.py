"""The cloud path on the multi-node rehearsal cluster, on the README's own run of it (tests/documented_cluster_run.py:
`ftstack run --stack cluster --wait` over SSH to the login node): bundle upload, sbatch, waits, log tails; 2-node
readiness and training; artifacts fetched back; the SSH link dropped mid-wait is reconnected; a second run submits
nothing; `ftstack status` and `ftstack runs`; a replaced or destroyed stage is cancelled over SSH; a serving node
serves beside training and takes a passed fine-tune.

The README's one run serves every assertion about a run; the serving test adds its own small chain.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import Cluster
from documented_cluster_run import STACK, DocumentedClusterRun
from slurm_jobs import job_field

from infra.config import load_stack_config
from infra.pipeline.connect import open_transport
from infra.pipeline.jobs import SlurmJobProvider, job_inputs
from infra.pipeline.runner import transport_spec
from infra.pipeline.slurm import SlurmClient

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
FTSTACK = str(Path(sys.executable).with_name("ftstack"))
STAGES = ["environment", "prepare", "readiness", "train", "eval"]
SUBMITTED = re.compile(r"^(\w+): submitted job (\d+)$", re.MULTILINE)


def ftstack(*args: str, cluster: Cluster, stack: str = STACK, config_dir: Path = REPO / "stacks",
            timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FTSTACK, *args, "--stack", stack, "--config-dir", str(config_dir),
                           "--ssh-key", str(cluster.private_key)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def stored_index(documented: DocumentedClusterRun) -> dict[str, Any]:
    """The documented run as `ftstack runs --json` lists it (found by its jobs: earlier sessions' runs stay stored)."""
    listed = subprocess.run([FTSTACK, "runs", "--stack", STACK, "--json"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert listed.returncode == 0, listed.stderr
    (index,) = [index for index in json.loads(listed.stdout) if index["job_ids"] == documented.job_ids]
    return index


def test_pipeline_runs_over_ssh_with_two_node_training(documented_cluster_run: DocumentedClusterRun,
                                                       local_cluster: Cluster) -> None:
    documented, stderr = documented_cluster_run, documented_cluster_run.page.stderr
    assert [stage for stage, _ in SUBMITTED.findall(stderr)] == STAGES
    stages = documented.state["stages"]
    assert list(stages) == STAGES and {entry["outs"]["state"] for entry in stages.values()} == {"COMPLETED"}
    assert f"uploaded to {local_cluster.jail_root}/home/shared/finetune_code/" in stderr
    assert documented.run.train is not None and f"step {documented.run.train.max_steps} loss" in stderr
    readiness = json.loads(next(documented.paths.results_dir.glob("readiness-*.json")).read_text())
    assert readiness["ok"] and readiness["world_size"] == 2
    assert readiness["allreduce"]["nodes"] == 2 and readiness["allreduce"]["correct"]
    assert sorted(node["hostname"] for node in readiness["nodes"]) == local_cluster.training_workers
    manifest = json.loads((documented.paths.train_run_dir / "run_manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["world_size"] == 2 and manifest["nodes"] == 2
    train = stages["train"]["outs"]
    train_log = local_cluster.on_host(train["output"].replace("%j", train["job_id"]))
    assert f"2 node(s) x 1 process(es), rendezvous {local_cluster.workers[0]}:" in train_log.read_text()
    # every job asked for the CPUs of its nodes, the stack's cpusPerNode (Slurm keeps finished jobs a day)
    assert documented.stack.cluster is not None
    cpus = documented.stack.cluster.cpus_per_node
    asked = {stage: (job_field(entry["outs"]["job_id"], "NumCPUs", local_cluster.slurm_conf),
                     job_field(entry["outs"]["job_id"], "CPUs/Task", local_cluster.slurm_conf))
             for stage, entry in stages.items()}
    assert asked["train"] == asked["readiness"] == (str(2 * cpus), str(cpus)), asked
    assert asked["prepare"] == asked["environment"] == asked["eval"] == (str(cpus), str(cpus)), asked


def test_dropped_ssh_link_is_reconnected_without_resubmitting(documented_cluster_run: DocumentedClusterRun,
                                                              local_cluster: Cluster) -> None:
    dropped = documented_cluster_run.dropped
    assert dropped.get("pids"), "no SSH session was open to drop while training"
    after_drop = (local_cluster.base / "log" / "sshd.log").read_bytes()[dropped["log_offset"]:].decode(errors="replace")
    assert "Accepted publickey for root" in after_drop, "ftstack did not log in again after the drop"
    stderr = documented_cluster_run.page.stderr
    assert len(SUBMITTED.findall(stderr)) == len(STAGES)
    assert documented_cluster_run.run.train is not None
    assert f"step {documented_cluster_run.run.train.max_steps} loss" in stderr
    name = documented_cluster_run.run.name
    logs = sorted(p.name.rsplit("-", 1)[0] for p in (documented_cluster_run.paths.results_dir / "logs").glob("*.out"))
    assert logs == sorted(f"{name}-{stage}" for stage in STAGES)


def test_second_run_submits_nothing_and_status_reads_over_ssh(documented_cluster_run: DocumentedClusterRun,
                                                              local_cluster: Cluster) -> None:
    """The README's command again (with --json): nothing is submitted, the evaluation is the first run's."""
    second = ftstack("run", "--wait", "--json", cluster=local_cluster, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads(second.stdout)
    state = documented_cluster_run.state
    assert again["submitted"] == [] and again["evaluation"] == state["evaluation"]
    status = ftstack("status", "--json", cluster=local_cluster, timeout=300)
    assert status.returncode == 0, status.stderr
    jobs = json.loads(status.stdout)["jobs"]
    assert {stage: job["job_id"] for stage, job in jobs.items()} == documented_cluster_run.job_ids
    assert {job["state"] for job in jobs.values()} == {"COMPLETED"}


def test_artifacts_come_back_listed_and_reported(documented_cluster_run: DocumentedClusterRun, tmp_path: Path) -> None:
    documented = documented_cluster_run
    assert "artifacts stored in" in documented.page.stderr
    index = stored_index(documented)
    eval_job = documented.job_ids["eval"]
    assert index["run_name"] == documented.run.name
    assert {"train/metrics.jsonl", "train/run_manifest.json", f"eval/evaluator_{eval_job}.json"} <= set(index["files"])
    assert index["perplexity_finetuned"] == documented.state["evaluation"]["finetuned_model"]["perplexity"]
    stored = REPO / ".local/artifacts/runs" / STACK / index["run_id"]
    assert (stored / "train/metrics.jsonl").read_bytes() == (documented.paths.train_run_dir / "metrics.jsonl").read_bytes()
    for chart in documented.paths.train_run_dir.glob("*.png"):
        assert (stored / "train" / chart.name).read_bytes() == chart.read_bytes()
    report = subprocess.run([FTSTACK, "report", "--stack", STACK, "--out", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert index["run_id"] in (tmp_path / "index.html").read_text()


def test_replaced_or_destroyed_job_is_cancelled_over_ssh(documented_cluster_run: DocumentedClusterRun,
                                                         local_cluster: Cluster) -> None:
    """What `pulumi up` (replace) and `pulumi destroy` do to a live stage: the provider's delete scancels it
    through the login node, and the job's own work never happens."""
    spec = transport_spec(documented_cluster_run.stack, private_key=local_cluster.private_key.read_text(),
                          repo_root=REPO)
    folder = local_cluster.jail / "home/shared/cancel-test"
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "finished"
    marker.unlink(missing_ok=True)
    # set -e as in the stage scripts: slurmstepd signals the job's processes one by one, so a shell whose sleep
    # died first could still run the next line before its own SIGTERM
    (folder / "sleep.sbatch").write_text("#!/bin/bash\nset -e\nsleep 120\ntouch finished\n")
    bundle = f"{local_cluster.jail_root}/home/shared/cancel-test"
    provider = SlurmJobProvider()
    props = job_inputs(script="sleep.sbatch", bundle_path=bundle, fingerprint="cancel-test", transport=spec,
                       job_name="ft-cancel-test", output=f"{bundle}/cancel-%j.out")
    created = provider.create(props)
    transport = open_transport(spec)
    try:
        client = SlurmClient(transport)
        deadline = time.monotonic() + 120
        while client.state(created.id).state == "PENDING" and time.monotonic() < deadline:
            time.sleep(1)
        assert client.state(created.id).state == "RUNNING"
        provider.delete(created.id, created.outs)
        # squeue shows COMPLETING while slurmd ends the cancelled script (seconds under load)
        deadline = time.monotonic() + 120
        while client.state(created.id).state == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(1)
        assert client.state(created.id).state == "CANCELLED"
    finally:
        transport.close()
    assert not marker.exists()


def test_training_cost_uses_the_throughput_this_run_measured_on_the_cluster(
        documented_cluster_run: DocumentedClusterRun) -> None:
    """The outputs price the training run at the throughput the cluster's records show (their tokens over their
    time, per rank), fetched over SSH: this machine has no copy at the run config's paths."""
    from infra.commands.run import outputs_path

    documented = documented_cluster_run
    root = documented.run.paths.root
    assert not (REPO / root).exists() and not Path(root).is_absolute()
    remote = documented.paths.train_run_dir
    lines = [json.loads(line) for line in (remote / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [r for r in lines if r.get("tokens") and r.get("tokens_per_second")]
    world_size = json.loads((remote / "run_manifest.json").read_text())["world_size"]
    expected = sum(r["tokens"] for r in timed) / sum(r["tokens"] / r["tokens_per_second"] for r in timed) / world_size
    outputs = json.loads(outputs_path(REPO, STACK).read_text())
    assert outputs["training_run_tokens_per_second_per_gpu"] == pytest.approx(expected, rel=1e-3)
    assert outputs["training_run_gpus"] == world_size == 2
    # the outputs keep 4 decimal places: a run of seconds is 0.000x hours
    assert outputs["training_run_wall_hours"] == pytest.approx(
        outputs["training_run_tokens"] / (expected * world_size) / 3600, rel=1e-3, abs=5e-5)
    source = outputs["training_run_throughput_source"]
    index = stored_index(documented)
    assert source.startswith("measured: ") and index["run_id"] in source and f"stack {STACK}" in source
    assert index["throughput"]["tokens_per_second_per_device"] == pytest.approx(expected, rel=1e-3)
    assert index["throughput"]["device_kind"] == "cpu" and index["throughput"]["devices"] == 2


def test_every_job_ran_in_the_environment_the_pipeline_built(documented_cluster_run: DocumentedClusterRun,
                                                             local_cluster: Cluster) -> None:
    """The jobs after the environment stage name its interpreter, and it holds the lock's versions, built on a node
    from the shipped wheelhouse (the nodes have no route to an index)."""
    from documents.environment_manifest import read_environment_manifest
    from infra.commands.run import outputs_path
    from infra.environment.lock import TARGETS, pins

    stages = documented_cluster_run.state["stages"]
    built = stages["environment"]["outs"]["results_path"]
    assert built.startswith(f"{local_cluster.jail_root}/home/shared/finetune_env/")
    manifest_file = local_cluster.on_host(built) / "environment.json"
    manifest = read_environment_manifest(manifest_file.read_bytes(), str(manifest_file))
    assert manifest.source == "wheelhouse" and manifest.node in local_cluster.workers
    locked = pins(TARGETS["local"].file.read_text())
    assert {name: manifest.packages.get(name) for name in locked} == locked
    for stage in ("prepare", "readiness", "train", "eval"):
        assert stages[stage]["outs"]["env"]["FT_PYTHON"] == f"{built}/bin/python", stage
    outputs = json.loads(outputs_path(REPO, STACK).read_text())
    assert outputs["environment_key"] == manifest.key and outputs["environment_source"] == "wheelhouse"
    assert outputs["environment_size_bytes"] == manifest.size_bytes > 0
    assert outputs["environment_build_seconds"] == manifest.build_seconds > 0


def tiny_serving_config(model_dir: Path, root: str) -> dict[str, Any]:
    """workloads/configs/cluster.json on the tiny model, 64 conversations and 4 training steps, served by the peft
    engine; the publish gate admits any change (the tiny random model's perplexity after 4 steps is noise: the
    gate's rule is unit-tested)."""
    config = json.loads((REPO / "workloads/configs/cluster.json").read_text())
    config["name"] = "ctiny-served"
    config["paths"]["root"] = root
    config["model"] = {"source": f"dir:{model_dir}"}
    config["data"].update(rows=64, max_length=256)
    config["train"].update(quantization="none", max_steps=4, save_steps=2, micro_batch_size=1,
                           lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]})
    config["eval"].update(perplexity_rows=8, num_prompts=2, num_samples=1, max_new_tokens=8)
    config["serve"].update(engine="peft", publish_min_perplexity_improvement_pct=-100.0)
    return config


def squeue(cluster: Cluster, job_ids: list[str]) -> dict[str, tuple[str, str, str]]:
    """Job id -> (state, node list, partition) as the cluster's squeue shows them from this machine."""
    shown = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T %N %P"], capture_output=True,
                           text=True, env={**os.environ, "SLURM_CONF": str(cluster.slurm_conf)}, timeout=60)
    return {job: (state, nodes, partition) for job, state, nodes, partition in
            (line.split() for line in shown.stdout.splitlines() if len(line.split()) == 4)}


def test_a_serving_node_serves_while_the_training_nodes_work_and_takes_a_passed_fine_tune(
        documented_cluster_run: DocumentedClusterRun, local_cluster: Cluster, tiny_model_dir: Path,
        tmp_path: Path) -> None:
    """Seed 000's dedicated worker (serving.nodes 1): the chain's serve job starts on the serving node with the base
    alone, needing no training; the chain's train job runs on the training node meanwhile, then its eval; the
    publish job, once eval passed the gate, stores the run and loads it through the gateway's vLLM route: the new
    fine-tune is then in /v1/models and answers, from the same serve job whose launcher started its engine once.
    A chain of its own (tiny model, its own root), from the bundle and environment the README's run left."""
    import httpx

    from documents.adapter_registry import adapter_sha256
    from documents.run_config import load_run_config
    from infra.pipeline.chain import code_location_for, job_arguments, pipeline_jobs
    from infra.pipeline.runner import read_publication_record

    root = "mnt/data/pytest-serve"
    shutil.rmtree(local_cluster.jail / root, ignore_errors=True)
    config = tmp_path / "ctiny-serving.json"
    config.write_text(json.dumps(tiny_serving_config(tiny_model_dir, root), indent=2))
    name = "cluster-serve-test"
    stacks = tmp_path / "stacks"
    local_cluster.stack_file(stacks, name, config, serving_nodes=1)
    stack = load_stack_config(name, stacks)
    run = load_run_config(config)
    jobs = {job.stage: job for job in pipeline_jobs(stack, run, str(config), "unused", code_location_for(stack, run, REPO),
                                                    serve=True)}
    bundle = documented_cluster_run.state["stages"]["eval"]["outs"]["bundle_path"]
    spec = transport_spec(stack, private_key=local_cluster.private_key.read_text(), repo_root=REPO)
    provider = SlurmJobProvider()

    def submit(stage: str, after: list[str]) -> Any:
        return provider.create(job_inputs(**job_arguments(jobs[stage], bundle_path=bundle, dependencies=after,
                                                          transport=spec, slurm_env={}, wait=False)))

    host_root = local_cluster.jail / root
    paths = run.locate(host_root)
    served_file = paths.results_dir / "served_adapters.json"
    (paths.results_dir / "logs").mkdir(parents=True)  # the jobs' logs go there (`ftstack run` makes it so)
    prepared = submit("prepare", [])
    serve = submit("serve", [prepared.id])
    transport = open_transport(spec)
    try:
        client = SlurmClient(transport)
        deadline = time.monotonic() + 600
        while not (served_file.is_file() and json.loads(served_file.read_text()).get("url")):
            assert client.state(serve.id).state in ("PENDING", "CONFIGURING", "RUNNING"), client.state(serve.id)
            assert time.monotonic() < deadline, "the server never reported its address"
            time.sleep(1)
        assert json.loads(served_file.read_text())["adapters"] == []
        training = submit("train", [prepared.id])
        evaluation = submit("eval", [training.id])
        published = submit("publish", [evaluation.id])
        deadline = time.monotonic() + 600
        # squeue may not list a job in the instant Slurm allocates it: its end is read from scontrol instead
        while (seen := squeue(local_cluster, [serve.id, training.id])).get(training.id, ("PENDING",))[0] != "RUNNING":
            state = client.state(training.id).state
            assert state in ("PENDING", "CONFIGURING", "RUNNING") and time.monotonic() < deadline, \
                f"train never ran beside the server: {state}, squeue {seen}"
            time.sleep(0.5)
        assert seen[serve.id] == ("RUNNING", local_cluster.serving_node, "serve")
        assert seen[training.id] == ("RUNNING", local_cluster.workers[0], "main")
        deadline = time.monotonic() + 900
        while (state := client.state(published.id).state) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            assert time.monotonic() < deadline, f"publish still {state}"
            time.sleep(2)
        log = local_cluster.on_host(jobs["publish"].output.replace("%j", published.id)).read_text()
        assert state == "COMPLETED", log[-3000:]
        model = f"ctiny-served-{evaluation.id}"
        # what `ftstack run --wait` reports: the record the job wrote beside the eval reports, as its log's last line
        publication = read_publication_record(transport, jobs["publish"], published.id)
        assert publication.model_dump(exclude_none=True) == json.loads(log.strip().splitlines()[-1])
        assert publication.published and publication.model == model and publication.outcome == "loaded"
        assert publication.eval_job == evaluation.id

        key = (host_root / "serving/api.key").read_text().strip()
        url = f"http://{local_cluster.subnet}.{10 + len(local_cluster.workers)}:{run.serve.port}"
        auth = {"Authorization": f"Bearer {key}"}
        listed = httpx.get(f"{url}/v1/models", headers=auth, timeout=60)
        assert listed.status_code == 200 and {m["id"] for m in listed.json()["data"]} == {"base", model}
        answer = httpx.post(f"{url}/v1/chat/completions", headers=auth, timeout=300, json={
            "model": model, "messages": [{"role": "user", "content": "What is a bond?"}], "max_tokens": 4})
        assert answer.status_code == 200 and answer.json()["model"] == model
        assert client.state(serve.id).state == "RUNNING"
        serve_log = local_cluster.on_host(jobs["serve"].output.replace("%j", serve.id)).read_text()
        assert serve_log.count("engine peft; models: ['base']") == 1 and "; restart " not in serve_log
        stored = host_root / "serving/store/runs" / name / model
        index = json.loads((stored / "run.json").read_text())
        trained = paths.adapter_dir
        assert index["adapter_sha256"] == adapter_sha256(stored / "adapter") == adapter_sha256(trained)
    finally:
        provider.delete(serve.id, serve.outs)
        transport.close()
