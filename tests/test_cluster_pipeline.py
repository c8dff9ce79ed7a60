"""The cloud path on the multi-node rehearsal cluster: `ftstack run --stack cluster --wait` over SSH to the login
node (bundle upload, sbatch, waits, log tails), 2-node readiness and training, artifacts fetched back, a second
run that submits nothing, `ftstack status` and `ftstack runs`; the SSH link dropped mid-wait is reconnected; a
replaced or destroyed stage is cancelled over SSH.

One pipeline run (tiny model, 4 steps) serves every assertion of this module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import Cluster
from slurm_jobs import job_field

from infra.config import load_stack_config
from infra.pipeline.connect import open_transport
from infra.pipeline.jobs import SlurmJobProvider, job_inputs
from infra.pipeline.runner import transport_spec
from infra.pipeline.slurm import SlurmClient

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
STACK = "cluster-test"
FTSTACK = str(Path(sys.executable).with_name("ftstack"))


def tiny_cluster_config(model_dir: Path, root: str) -> dict[str, Any]:
    """workloads/configs/cluster.json on the tiny model, 64 conversations and 4 training steps."""
    config = json.loads((REPO / "workloads/configs/cluster.json").read_text())
    config["name"] = "ctiny"
    config["paths"]["root"] = root
    config["model"] = {"source": f"dir:{model_dir}"}
    config["data"].update(rows=64, max_length=256)
    config["train"].update(quantization="none", max_steps=4, save_steps=2, micro_batch_size=1,
                           lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]})
    config["eval"].update(perplexity_rows=8, num_prompts=2, num_samples=1, max_new_tokens=8)
    return config


def ftstack(*args: str, cluster: Cluster, config_dir: Path, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FTSTACK, *args, "--stack", STACK, "--config-dir", str(config_dir),
                           "--ssh-key", str(cluster.private_key)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def drop_ssh_links_once_training(cluster: Cluster, metrics: Path, done: threading.Event, dropped: dict[str, Any]) -> None:
    """Once training has logged a step, end every SSH session of the login node (the per-connection sshd
    children of its listener) as a dropped link would; the listener stays, so ftstack can reconnect.
    Records the killed pids and how far the login node's sshd log had got at that moment."""
    listener = (cluster.base / "run" / "sshd.pid").read_text().strip()
    while not done.is_set():
        if metrics.is_file() and metrics.stat().st_size > 0:
            children = subprocess.run(["ps", "-o", "pid=", "--ppid", listener], capture_output=True, text=True)
            dropped["log_offset"] = (cluster.base / "log" / "sshd.log").stat().st_size
            for pid in children.stdout.split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
                dropped.setdefault("pids", []).append(int(pid))
            return
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster_run(local_cluster: Cluster, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The first `ftstack run --wait` (with its SSH links dropped mid-training) and the facts the tests check."""
    root = "mnt/data/pytest-cluster"
    shutil.rmtree(local_cluster.jail / root, ignore_errors=True)
    here = tmp_path_factory.mktemp("cluster-stack")
    config = here / "ctiny.json"
    config.write_text(json.dumps(tiny_cluster_config(tiny_model_dir, root), indent=2))
    local_cluster.stack_file(here / "stacks", STACK, config)
    (REPO / ".local/pipeline" / f"{STACK}.json").unlink(missing_ok=True)
    shutil.rmtree(REPO / ".local/artifacts/runs" / STACK, ignore_errors=True)

    metrics = local_cluster.jail / root / "outputs/ctiny/metrics.jsonl"
    done, dropped = threading.Event(), {}
    dropper = threading.Thread(target=drop_ssh_links_once_training, args=(local_cluster, metrics, done, dropped))
    dropper.start()
    started = time.monotonic()
    try:
        first = ftstack("run", "--wait", "--json", cluster=local_cluster, config_dir=here / "stacks")
    finally:
        done.set()
        dropper.join()
    assert first.returncode == 0, first.stderr[-4000:]
    return {"first": first, "run": json.loads(first.stdout), "seconds": time.monotonic() - started,
            "dropped": dropped, "config_dir": here / "stacks", "root": local_cluster.jail / root}


def test_pipeline_runs_over_ssh_with_two_node_training(cluster_run: dict[str, Any], local_cluster: Cluster) -> None:
    run, stderr = cluster_run["run"], cluster_run["first"].stderr
    assert run["submitted"] == ["environment", "prepare", "readiness", "train", "eval"]
    assert {job["state"] for job in run["jobs"].values()} == {"COMPLETED"}
    assert f"uploaded to {local_cluster.jail_root}/home/shared/finetune_code/" in stderr
    assert "step 4 loss" in stderr
    root = cluster_run["root"]
    readiness = json.loads(next((root / "results").glob("readiness-*.json")).read_text())
    assert readiness["ok"] and readiness["world_size"] == 2
    assert readiness["allreduce"]["nodes"] == 2 and readiness["allreduce"]["correct"]
    assert sorted(node["hostname"] for node in readiness["nodes"]) == local_cluster.training_workers
    manifest = json.loads((root / "outputs/ctiny/run_manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["world_size"] == 2 and manifest["nodes"] == 2
    train_log = local_cluster.on_host(run["jobs"]["train"]["output"].replace("%j", run["jobs"]["train"]["job_id"]))
    assert f"2 node(s) x 1 process(es), rendezvous {local_cluster.workers[0]}:" in train_log.read_text()
    # every job asked for the CPUs of its nodes, the stack's cpusPerNode (Slurm keeps finished jobs a day)
    cpus = load_stack_config(STACK, cluster_run["config_dir"]).cluster.cpus_per_node
    asked = {stage: (job_field(job["job_id"], "NumCPUs", local_cluster.slurm_conf),
                     job_field(job["job_id"], "CPUs/Task", local_cluster.slurm_conf)) for stage, job in run["jobs"].items()}
    assert asked["train"] == asked["readiness"] == (str(2 * cpus), str(cpus)), asked
    assert asked["prepare"] == asked["environment"] == asked["eval"] == (str(cpus), str(cpus)), asked


def test_dropped_ssh_link_is_reconnected_without_resubmitting(cluster_run: dict[str, Any], local_cluster: Cluster) -> None:
    dropped = cluster_run["dropped"]
    assert dropped.get("pids"), "no SSH session was open to drop while training"
    after_drop = (local_cluster.base / "log" / "sshd.log").read_bytes()[dropped["log_offset"]:].decode(errors="replace")
    assert "Accepted publickey for root" in after_drop, "ftstack did not log in again after the drop"
    stderr = cluster_run["first"].stderr
    assert stderr.count("submitted job") == 5 and "step 4 loss" in stderr
    logs = sorted(p.name.rsplit("-", 1)[0] for p in (cluster_run["root"] / "results/logs").glob("*.out"))
    assert logs == ["ctiny-environment", "ctiny-eval", "ctiny-prepare", "ctiny-readiness", "ctiny-train"]


def test_second_run_submits_nothing_and_status_reads_over_ssh(cluster_run: dict[str, Any], local_cluster: Cluster) -> None:
    second = ftstack("run", "--wait", "--json", cluster=local_cluster, config_dir=cluster_run["config_dir"], timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads(second.stdout)
    assert again["submitted"] == [] and again["evaluation"] == cluster_run["run"]["evaluation"]
    status = ftstack("status", "--json", cluster=local_cluster, config_dir=cluster_run["config_dir"], timeout=300)
    assert status.returncode == 0, status.stderr
    jobs = json.loads(status.stdout)["jobs"]
    assert {stage: job["job_id"] for stage, job in jobs.items()} == \
        {stage: job["job_id"] for stage, job in cluster_run["run"]["jobs"].items()}
    assert {job["state"] for job in jobs.values()} == {"COMPLETED"}


def test_artifacts_come_back_listed_and_reported(cluster_run: dict[str, Any], tmp_path: Path) -> None:
    assert "artifacts stored in" in cluster_run["first"].stderr
    listed = subprocess.run([FTSTACK, "runs", "--stack", STACK, "--config-dir", str(cluster_run["config_dir"]), "--json"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    (index,) = json.loads(listed.stdout)
    eval_job = cluster_run["run"]["jobs"]["eval"]["job_id"]
    assert index["job_ids"]["eval"] == eval_job and index["run_name"] == "ctiny"
    assert {"train/metrics.jsonl", "train/run_manifest.json", f"eval/evaluator_{eval_job}.json"} <= set(index["files"])
    assert index["perplexity_finetuned"] == cluster_run["run"]["evaluation"]["finetuned_model"]["perplexity"]
    stored = REPO / ".local/artifacts/runs" / STACK / index["run_id"]
    remote = cluster_run["root"] / "outputs/ctiny/metrics.jsonl"
    assert (stored / "train/metrics.jsonl").read_bytes() == remote.read_bytes()
    for chart in (cluster_run["root"] / "outputs/ctiny").glob("*.png"):
        assert (stored / "train" / chart.name).read_bytes() == chart.read_bytes()
    report = subprocess.run([FTSTACK, "report", "--stack", STACK, "--config-dir", str(cluster_run["config_dir"]),
                             "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    assert index["run_id"] in (tmp_path / "index.html").read_text()


def test_replaced_or_destroyed_job_is_cancelled_over_ssh(cluster_run: dict[str, Any], local_cluster: Cluster) -> None:
    """What `pulumi up` (replace) and `pulumi destroy` do to a live stage: the provider's delete scancels it
    through the login node, and the job's own work never happens."""
    stack = load_stack_config(STACK, cluster_run["config_dir"])
    spec = transport_spec(stack, private_key=local_cluster.private_key.read_text(), repo_root=REPO)
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


def test_training_cost_uses_the_throughput_this_run_measured_on_the_cluster(cluster_run: dict[str, Any]) -> None:
    """The outputs price the training run at the throughput the cluster's records show (their tokens over their
    time, per rank), fetched over SSH: this machine has no copy at the run config's paths."""
    from infra.commands.run import outputs_path

    run_config = json.loads((cluster_run["config_dir"] / ".." / "ctiny.json").resolve().read_text())
    assert not (REPO / run_config["paths"]["root"]).exists() and not Path(run_config["paths"]["root"]).is_absolute()
    remote = cluster_run["root"] / "outputs/ctiny"
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
    (index,) = json.loads(subprocess.run(
        [FTSTACK, "runs", "--stack", STACK, "--config-dir", str(cluster_run["config_dir"]), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True).stdout)
    assert source.startswith("measured: ") and index["run_id"] in source and f"stack {STACK}" in source
    assert index["throughput"]["tokens_per_second_per_device"] == pytest.approx(expected, rel=1e-3)
    assert index["throughput"]["device_kind"] == "cpu" and index["throughput"]["devices"] == 2


def test_every_job_ran_in_the_environment_the_pipeline_built(cluster_run: dict[str, Any], local_cluster: Cluster) -> None:
    """The jobs after the environment stage name its interpreter, and it holds the lock's versions, built on a node
    from the shipped wheelhouse (the nodes have no route to an index)."""
    from documents.environment_manifest import read_environment_manifest
    from infra.environment.lock import TARGETS, pins

    stages = json.loads((REPO / ".local/pipeline" / f"{STACK}.json").read_text())["stages"]
    built = stages["environment"]["outs"]["results_path"]
    assert built.startswith(f"{local_cluster.jail_root}/home/shared/finetune_env/")
    manifest_file = local_cluster.on_host(built) / "environment.json"
    manifest = read_environment_manifest(manifest_file.read_bytes(), str(manifest_file))
    assert manifest.source == "wheelhouse" and manifest.node in local_cluster.workers
    locked = pins(TARGETS["local"].file.read_text())
    assert {name: manifest.packages.get(name) for name in locked} == locked
    for stage in ("prepare", "readiness", "train", "eval"):
        assert stages[stage]["outs"]["env"]["FT_PYTHON"] == f"{built}/bin/python", stage
    from infra.commands.run import outputs_path

    outputs = json.loads(outputs_path(REPO, STACK).read_text())
    assert outputs["environment_key"] == manifest.key and outputs["environment_source"] == "wheelhouse"
    assert outputs["environment_size_bytes"] == manifest.size_bytes > 0
    assert outputs["environment_build_seconds"] == manifest.build_seconds > 0


def squeue(cluster: Cluster, job_ids: list[str]) -> dict[str, tuple[str, str, str]]:
    """Job id -> (state, node list, partition) as the cluster's squeue shows them from this machine."""
    shown = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T %N %P"], capture_output=True,
                           text=True, env={**os.environ, "SLURM_CONF": str(cluster.slurm_conf)}, timeout=60)
    return {job: (state, nodes, partition) for job, state, nodes, partition in
            (line.split() for line in shown.stdout.splitlines() if len(line.split()) == 4)}


def test_a_serving_node_serves_while_the_training_nodes_work_and_takes_a_passed_fine_tune(
        cluster_run: dict[str, Any], local_cluster: Cluster) -> None:
    """Seed 000's dedicated worker (serving.nodes 1): the chain's serve job starts on the serving node with the base
    alone, needing no training; the chain's train job runs on the training node meanwhile (a run of its own name,
    from this module's prepared model and data), then its eval; the publish job, once eval passed the gate, stores
    the run and loads it through the gateway's vLLM route: the new fine-tune is then in /v1/models and answers,
    from the same serve job whose launcher started its engine once."""
    import httpx

    from documents.adapter_registry import adapter_sha256
    from documents.run_config import load_run_config
    from infra.pipeline.chain import job_arguments, pipeline_jobs, code_location_for
    from infra.pipeline.runner import read_publication_record

    here, stacks = cluster_run["config_dir"].parent, cluster_run["config_dir"]
    document = json.loads((here / "ctiny.json").read_text())
    # the tiny random model's perplexity change after 4 steps is noise: the gate here admits any (its rule is unit-tested)
    document["serve"].update(engine="peft", publish_min_perplexity_improvement_pct=-100.0)
    document["name"] = "ctiny-served"  # its own outputs and checkpoints: trained here, beside the server
    config = here / "ctiny-serving.json"
    config.write_text(json.dumps(document, indent=2))
    name = "cluster-serve-test"
    local_cluster.stack_file(stacks, name, config, serving_nodes=1)
    stack = load_stack_config(name, stacks)
    run = load_run_config(config)
    jobs = {job.stage: job for job in pipeline_jobs(stack, run, str(config), "unused", code_location_for(stack, run, REPO),
                                                    serve=True)}
    bundle = json.loads((REPO / ".local/pipeline" / f"{STACK}.json").read_text())["stages"]["eval"]["outs"]["bundle_path"]
    spec = transport_spec(stack, private_key=local_cluster.private_key.read_text(), repo_root=REPO)
    provider = SlurmJobProvider()

    def submit(stage: str, after: list[str]) -> Any:
        return provider.create(job_inputs(**job_arguments(jobs[stage], bundle_path=bundle, dependencies=after,
                                                          transport=spec, slurm_env={}, wait=False)))

    root = cluster_run["root"]
    served_file = root / "results/served_adapters.json"
    served_file.unlink(missing_ok=True)
    serve = submit("serve", [])
    transport = open_transport(spec)
    try:
        client = SlurmClient(transport)
        deadline = time.monotonic() + 600
        while not (served_file.is_file() and json.loads(served_file.read_text()).get("url")):
            assert client.state(serve.id).state in ("PENDING", "CONFIGURING", "RUNNING"), client.state(serve.id)
            assert time.monotonic() < deadline, "the server never reported its address"
            time.sleep(1)
        assert json.loads(served_file.read_text())["adapters"] == []
        training = submit("train", [])
        evaluation = submit("eval", [training.id])
        published = submit("publish", [evaluation.id])
        deadline = time.monotonic() + 600
        while (seen := squeue(local_cluster, [serve.id, training.id])).get(training.id, ("PENDING",))[0] != "RUNNING":
            assert training.id in seen and time.monotonic() < deadline, f"train never ran beside the server: {seen}"
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

        key = (root / "serving/api.key").read_text().strip()
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
        stored = root / "serving/store/runs" / name / model
        index = json.loads((stored / "run.json").read_text())
        trained = root / "outputs/ctiny-served/adapter"
        assert index["adapter_sha256"] == adapter_sha256(stored / "adapter") == adapter_sha256(trained)
    finally:
        provider.delete(serve.id, serve.outs)
        transport.close()
