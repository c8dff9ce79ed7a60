"""scripts/local-cluster.sh refusals, without starting a cluster: a public subnet, every node reserved for serving,
and a namespace of the same name that this cluster did not make (it is never reused or removed); the tests' cluster
moves past a bridge another one left."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cluster_fixtures import free_identity

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "local-cluster.sh"


def script(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LOCAL_CLUSTER_DIR": str(tmp_path / "cluster"), **env})


def needs_root(what: str) -> None:
    """Skip without root, except in CI, which runs make test as root: a missing root fails there instead."""
    if os.geteuid() != 0:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI runs make test as root; {what} need it")
        pytest.skip(f"{what} need root")


def test_a_subnet_outside_the_private_ranges_is_refused(tmp_path: Path) -> None:
    result = script(tmp_path, "start", LOCAL_CLUSTER_SUBNET="8.8.8", LOCAL_CLUSTER_PREFIX="ftcq")
    assert result.returncode == 1
    assert "LOCAL_CLUSTER_SUBNET=8.8.8 is not the first three octets of a private /24" in result.stderr


def test_reserving_every_node_for_serving_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """The stack's own validation refuses it (the values are made from the stack with --serving-nodes for its
    serving.nodes)."""
    result = script(tmp_path, "start", "--nodes", "2", "--serving-nodes", "2", LOCAL_CLUSTER_PREFIX="ftcq")
    assert result.returncode == 1
    assert ("serving.nodes 2 reserves every node of the cluster (cluster.nodes 2): none would be left for training"
            in result.stderr)
    assert not (tmp_path / "cluster").exists()


def test_status_of_a_cluster_never_started_says_stopped(tmp_path: Path) -> None:
    result = script(tmp_path, "status", LOCAL_CLUSTER_PREFIX="ftcq")
    assert result.returncode == 1 and "slurmctld: stopped" in result.stdout


def test_a_namespace_this_cluster_did_not_make_is_refused_and_left_alone(tmp_path: Path) -> None:
    needs_root("network namespaces")
    subprocess.run(["ip", "netns", "add", "ftcq-ctl"], check=True)
    try:
        result = script(tmp_path, "start", LOCAL_CLUSTER_PREFIX="ftcq", LOCAL_CLUSTER_SUBNET="10.213.250")
        assert result.returncode == 1
        assert "netns ftcq-ctl exists but was not made by this cluster" in result.stderr
        stopped = script(tmp_path, "stop", LOCAL_CLUSTER_PREFIX="ftcq")
        assert stopped.returncode == 0
        assert Path("/run/netns/ftcq-ctl").exists()
    finally:
        script(tmp_path, "stop", LOCAL_CLUSTER_PREFIX="ftcq", LOCAL_CLUSTER_SUBNET="10.213.250")
        subprocess.run(["ip", "netns", "del", "ftcq-ctl"], capture_output=True)


CANDIDATES = [("ftcr", "10.213.248"), ("ftcs", "10.213.249")]
"""two identities of the tests' own, for the fixture's choice of prefix and subnet."""


def needs_root_for_bridges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bridges need root; the fixture's choice is not forced by LOCAL_CLUSTER_PREFIX."""
    needs_root("bridges")
    monkeypatch.delenv("LOCAL_CLUSTER_PREFIX", raising=False)


def record_made(folder: Path, made: str) -> None:
    """The cluster folder's record of what its script made (`run/created`), as the script writes it."""
    (folder / "run").mkdir(parents=True)
    (folder / "run" / "created").write_text(made)


def test_the_tests_cluster_moves_past_a_bridge_another_cluster_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a machine image with another checkout's cluster bridge did to CI: the fixture takes the next name."""
    needs_root_for_bridges(monkeypatch)
    subprocess.run(["ip", "link", "add", "ftcr-br", "type", "bridge"], check=True)
    try:
        assert free_identity(tmp_path / "cluster", CANDIDATES) == ("ftcs", "10.213.249")
        record_made(tmp_path / "cluster", "link:ftcr-br\n")
        assert free_identity(tmp_path / "cluster", CANDIDATES) == ("ftcr", "10.213.248")
    finally:
        subprocess.run(["ip", "link", "del", "ftcr-br"], capture_output=True)


def test_the_tests_cluster_keeps_the_name_its_folder_already_runs_under(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A session that found the default name taken started the folder's cluster as the next one; once the default
    is free again, the next session must find that cluster under its own name, not start the default one over it in
    the same folder (its pid files answer for daemons in other namespaces: the login node refused connections)."""
    needs_root_for_bridges(monkeypatch)
    subprocess.run(["ip", "link", "add", "ftcs-br", "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", "10.213.249.1/24", "dev", "ftcs-br"], check=True)
        record_made(tmp_path / "cluster", "link:ftcs-br\nnetns:ftcs-ctl\n")
        assert free_identity(tmp_path / "cluster", CANDIDATES) == ("ftcs", "10.213.249")
    finally:
        subprocess.run(["ip", "link", "del", "ftcs-br"], capture_output=True)


def test_a_namespace_is_emptied_even_of_processes_forked_while_it_was_being_emptied(tmp_path: Path) -> None:
    """`stop` (and `lose-node`) kill every process of the cluster's namespaces; a process that forks without pause
    leaves children that one listing and one kill miss (what a lost node's stepd starting a task would leave
    running beside the requeued job). Every child it forked is gone afterwards."""
    needs_root("network namespaces")
    forked = tmp_path / "forked"
    subprocess.run(["ip", "netns", "add", "ftcq-n1"], check=True)
    try:
        spawner = subprocess.Popen(["ip", "netns", "exec", "ftcq-n1", "bash", "-c",
                                    f"while :; do sleep 1000 & echo $! >> {forked}; done"])
        while not forked.is_file() or len(forked.read_text().split()) < 20:  # forking, a count not a clock
            assert spawner.poll() is None, "the forking process ended on its own"
        record_made(tmp_path / "cluster", "netns:ftcq-n1\n")
        assert script(tmp_path, "stop", LOCAL_CLUSTER_PREFIX="ftcq").returncode == 0
        spawner.wait(timeout=60)
        alive = [pid for pid in forked.read_text().split() if Path(f"/proc/{pid}").exists()
                 and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]]
        assert not alive, f"{len(alive)} of {len(forked.read_text().split())} forked processes survived the stop"
    finally:
        for pid in (forked.read_text().split() if forked.is_file() else []):
            subprocess.run(["kill", "-9", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", "ftcq-n1"], capture_output=True)
