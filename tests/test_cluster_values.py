"""The rehearsal cluster obeys the operator's rules: started from Soperator values whose custom resources, as Helm
renders them, give a worker no node line (infra/soperator/render.py), that worker's slurmd (no -Z) exits and the
start fails saying why, as the worker never joins Slurm on the cloud; a NodeSet without `nodeConfig.static`
registers with the one CPU Slurm assumes, so a job asking the stack's CPUs per node is refused. One worker, no
pipeline: seconds."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from documents.soperator_values import SoperatorValues, write_soperator_values
from infra.config import load_run
from infra.plans import stack_plan
from infra.soperator.rehearsal import cluster_stack_values, read_stack
from workloads.train.launch import launch_environment, procs_per_node

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local-cluster.sh"
PREFIX, SUBNET = "ftcv", "10.213.246"
REFERENCE_CORES = 2
"""the smallest machine the suite runs on (README's timings: the 2-core reference machine)"""


@pytest.fixture
def cluster_dir(tmp_path: Path):
    if os.geteuid() != 0:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI runs make test as root; network namespaces need it")
        pytest.skip("network namespaces need root")
    base = tmp_path / "cluster"
    yield base
    run(base, "stop")


def run(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOCAL_CLUSTER_DIR": str(base), "LOCAL_CLUSTER_PREFIX": PREFIX, "LOCAL_CLUSTER_SUBNET": SUBNET,
           "SLURM_CONF": str(base / "etc" / "slurm.conf")}
    command = [str(SCRIPT), *args] if args[0] in ("start", "stop") else list(args)
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def stack_values(*, partitions: dict | None = None, static: str | None = None, cpus: int | None = None) -> SoperatorValues:
    """The `cluster` stack's values for one worker, with its SlurmCluster's `partitionConfiguration` or its NodeSet's
    `nodeConfig.static` replaced, or its CPUs per node."""
    stack = read_stack(ROOT / "stacks" / "Pulumi.cluster.yaml", nodes=1, serving_nodes=0)
    if cpus is not None:
        stack = stack.model_copy(update={"cluster": stack.cluster.model_copy(update={"cpus_per_node": cpus})})
    values = cluster_stack_values(stack)
    cluster = dict(values.slurm_cluster)
    if partitions is not None:
        cluster["partitionConfiguration"] = partitions
    nodeset = values.nodesets[0]
    if static is not None:
        nodeset = {**nodeset, "nodeConfig": {**nodeset["nodeConfig"], "static": static}}
    return values.model_copy(update={"slurm_cluster": cluster, "nodesets": [nodeset]})


def test_default_partitions_give_the_worker_no_node_line_and_it_never_joins(cluster_dir: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    write_soperator_values(values, stack_values(partitions={}))  # the chart's default: configType default
    started = run(cluster_dir, "start", "--values", str(values))
    assert started.returncode == 1
    assert ("slurmd of worker-0 exited (slurmd: fatal: Unable to determine this slurmd's NodeName): slurm.conf has no "
            "NodeName line for it") in started.stderr
    assert "partitionConfiguration.configType structured" in started.stderr
    assert "NodeName=" not in (cluster_dir / "etc" / "slurm.conf").read_text()
    # the controller runs, with Soperator's default partitions over no node at all
    assert run(cluster_dir, "sinfo", "-h", "-o", "%P %D").stdout.split("\n")[:2] == ["main* 0", "hidden 0"]


def test_a_nodeset_without_static_joins_with_one_cpu_and_the_stacks_cpus_cannot_be_placed(
        cluster_dir: Path, tmp_path: Path) -> None:
    cpus = 2  # more than the one CPU Slurm assumes
    stack = stack_values(cpus=cpus)
    assert stack.nodesets[0]["nodeConfig"]["static"].split()[0] == f"CPUs={cpus}"
    values = tmp_path / "values.yaml"
    write_soperator_values(values, stack_values(static="", cpus=cpus))
    started = run(cluster_dir, "start", "--values", str(values))
    assert started.returncode == 0, started.stderr
    assert run(cluster_dir, "sinfo", "-N", "-h", "-o", "%N %c").stdout.split("\n")[0] == "worker-0 1"
    refused = run(cluster_dir, "sbatch", "--test-only", f"--cpus-per-task={cpus}", "--wrap", "true")
    assert refused.returncode != 0 and "Requested node configuration is not available" in refused.stderr


def test_the_training_nodes_threads_fit_the_cores_they_share() -> None:
    """The rehearsal's nodes are namespaces of one machine: every node's training ranks together run as many OpenMP
    threads as the cores of the smallest machine the suite runs on, at most. Each rank takes OMP_NUM_THREADS = its
    node's CPUs / processes (workloads.train.launch), so with 2 CPUs a node the two nodes ran 4 threads on 2 cores,
    and 6 steps of the stack's training took 210 s (56 s with 1 CPU a node)."""
    stack = read_stack(ROOT / "stacks" / "Pulumi.cluster.yaml", nodes=None, serving_nodes=None)
    run = load_run(stack, ROOT)
    assert run is not None and run.train is not None
    train = run.train
    nproc = procs_per_node(train, stack.cluster.gpus_per_node)
    environment = launch_environment(train, stack.cluster.gpus_per_node, stack.cluster.cpus_per_node)
    threads = int(environment["OMP_NUM_THREADS"])
    training_nodes = stack_plan(stack, run).stages["train"].nodes
    assert training_nodes * nproc * threads <= REFERENCE_CORES, (
        f"{training_nodes} nodes x {nproc} ranks x {threads} threads on a {REFERENCE_CORES}-core machine")
