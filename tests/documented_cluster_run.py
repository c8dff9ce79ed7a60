"""The README's rehearsal-cluster blocks, run as written once a session on the tests' cluster (pytest plugin): the
one pipeline run that the page test (tests/test_docs_commands.py) and the cluster pipeline tests
(tests/test_cluster_pipeline.py) both check.

The page's commands address the cluster stacks/Pulumi.cluster.yaml names (its login host, jail root and host key
under .local/cluster): the tests' cluster when it holds the default folder, prefix and subnet (always in CI;
elsewhere when no other cluster took them first, tests/cluster_fixtures.free_identity). Otherwise the run fails in CI
and is skipped elsewhere. Before the page, the `cluster` stack's pipeline state, its run folder in the jail and the
uploaded bundles go, so that the page's `ftstack run` is a first run whatever an earlier session left (every stage
submitted, the bundle uploaded); a built environment is kept (its stage finds it), and so are stored runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import Cluster
from docs_blocks import PAGES, ROOT
from docs_shell import assert_ran, page_blocks, run_in_new_shell

from documents.run_config import RunConfig, RunPaths, load_run_config
from infra.config import StackConfig, load_stack_config
from infra.pipeline.runner import state_path

STACK = "cluster"
README = PAGES[0]


@dataclass(frozen=True)
class DocumentedClusterRun:
    """What the README's blocks did on the tests' cluster."""

    page: subprocess.CompletedProcess[str]
    """the page's shell: `ftstack run`'s progress (submissions, upload, waits, log tails) is on its stderr"""
    stack: StackConfig
    run: RunConfig
    paths: RunPaths
    """the run's folders as this machine sees them (in the cluster's jail)"""
    state: dict[str, Any]
    """the stack's pipeline state after the run (.local/pipeline/cluster.json): each stage's job and outputs"""
    dropped: dict[str, Any]
    """the SSH sessions ended mid-training (`pids`) and how far the login node's sshd log had got then"""

    @property
    def job_ids(self) -> dict[str, str]:
        """Stage -> Slurm job id of the run."""
        return {stage: entry["outs"]["job_id"] for stage, entry in self.state["stages"].items()}


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


def addressed_by_the_page(cluster: Cluster, stack: StackConfig) -> bool:
    """Whether the page's commands reach this cluster: the stack's login host, jail root and host key are its."""
    assert stack.cluster is not None
    return (stack.cluster.login_host == cluster.login_host and stack.cluster.jail_root == cluster.jail_root
            and (ROOT / stack.cluster.host_key_file).resolve() == cluster.host_key_file.resolve())


def first_run_ahead(cluster: Cluster, paths: RunPaths) -> None:
    """Remove what would make the page's run find its work done: the stack's state and outputs, the run's folder
    in the jail, the bundles uploaded to it."""
    for name in (f"{STACK}.json", f"{STACK}-outputs.json"):
        (state_path(ROOT, STACK).with_name(name)).unlink(missing_ok=True)
    shutil.rmtree(paths.root, ignore_errors=True)
    shutil.rmtree(cluster.jail / "home/shared/finetune_code", ignore_errors=True)


@pytest.fixture(scope="session")
def documented_cluster(local_cluster: Cluster) -> Cluster:
    """The tests' cluster, where the pages' rehearsal-cluster commands reach it (fails in CI, skips elsewhere)."""
    stack = load_stack_config(STACK, ROOT / "stacks")
    if not addressed_by_the_page(local_cluster, stack):
        message = (f"the pages' cluster commands address {stack.cluster and stack.cluster.login_host} (stack "
                   f"{STACK}); the tests' cluster is at {local_cluster.login_host} in {local_cluster.base}")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return local_cluster


@pytest.fixture(scope="session")
def documented_cluster_run(documented_cluster: Cluster) -> DocumentedClusterRun:
    """README's rehearsal-cluster blocks in one new shell (`scripts/local-cluster.sh start` finds the tests'
    cluster running and keeps it, `ftstack run --stack cluster --wait`, `ftstack runs`), with the login node's SSH
    sessions ended once training has logged a step: ftstack must log in again and go on."""
    stack = load_stack_config(STACK, ROOT / "stacks")
    run = load_run_config(ROOT / stack.pipeline.run_config)
    paths = run.locate(documented_cluster.jail / run.paths.root)
    first_run_ahead(documented_cluster, paths)
    done, dropped = threading.Event(), {}
    dropper = threading.Thread(target=drop_ssh_links_once_training,
                               args=(documented_cluster, paths.train_run_dir / "metrics.jsonl", done, dropped))
    dropper.start()
    try:
        page = run_in_new_shell(page_blocks(README, cluster=True), timeout=3600)
    finally:
        done.set()
        dropper.join()
    assert_ran(page, README.name)
    return DocumentedClusterRun(page=page, stack=stack, run=run, paths=paths,
                                state=json.loads(state_path(ROOT, STACK).read_text()), dropped=dropped)
