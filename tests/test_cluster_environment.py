"""The rehearsal cluster is honest about the environment: its nodes' own Python has none of the workloads'
packages, the jail holds no link to the repository's venv, and the nodes cannot reach a package index, so the
cluster pipeline (tests/test_cluster_pipeline.py) can only run in the environment its first stage built."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cluster_fixtures import Cluster

from infra.pipeline.connect import open_transport
from infra.pipeline.transport import Transport

pytestmark = [pytest.mark.cluster]
BARE_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def login(local_cluster: Cluster) -> Iterator[Transport]:
    transport = open_transport({"kind": "ssh", "host": local_cluster.login_host, "user": "root",
                                "private_key": local_cluster.private_key.read_text(),
                                "host_key": local_cluster.host_key_file.read_text().strip()})
    yield transport
    transport.close()


def on_node(login: Transport, node: str, command: str) -> tuple[int, str]:
    """`command` on `node` through Soperator's hidden partition, the one over every node (the serving node is in
    no other partition with the training nodes)."""
    result = login.run(f"srun --partition=hidden --nodes=1 --nodelist={node} --time=5 {command}", timeout=180)
    return result.exit_code, result.stdout + result.stderr


def test_the_nodes_own_python_cannot_import_torch(local_cluster: Cluster, login: Transport) -> None:
    for node in local_cluster.workers:
        code, output = on_node(login, node, f"{BARE_PYTHON} -c 'import torch'")
        assert code != 0 and "No module named 'torch'" in output, (node, output)


def test_the_jail_holds_no_venv_of_the_repository(local_cluster: Cluster) -> None:
    assert not (local_cluster.jail / "opt" / "venv").exists()


PYPI_ADDRESS = "151.101.0.223"
"""one of pypi.org's addresses (Fastly), dialled by number so that the check does not stop at name resolution."""


def test_a_node_cannot_reach_the_package_index(local_cluster: Cluster, login: Transport) -> None:
    node = local_cluster.workers[0]
    # this machine's pip configuration (PyPI, its local mirrors' file:// indexes and find-links) finds nothing there
    code, output = on_node(login, node, f"{BARE_PYTHON} -m pip download --no-deps --no-cache-dir --retries 0 "
                                        "--timeout 5 -d /tmp/ft-x six")
    assert code != 0 and "No matching distribution found for six" in output, output
    code, output = on_node(login, node, "sh -c 'ls -A /opt/pypi /opt/wheels 2>/dev/null | grep -v : | grep . || true'")
    assert code == 0 and output.strip() == "", output
    code, output = on_node(login, node, f"{BARE_PYTHON} -c \"import socket; "
                                        f"socket.create_connection(('{PYPI_ADDRESS}', 443), timeout=5)\"")
    assert code != 0 and "Network is unreachable" in output, output
