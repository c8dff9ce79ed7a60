"""The multi-node rehearsal cluster (scripts/local-cluster.sh) for the `cluster` stack tests (pytest plugin).

One cluster per test session: started when not already running (and then stopped at the end), left alone when
it was. Its layout follows the script's environment (LOCAL_CLUSTER_PREFIX, LOCAL_CLUSTER_SUBNET, LOCAL_CLUSTER_DIR).
In CI (CI=true) a cluster that cannot start fails the tests; elsewhere (no root, no namespaces) they skip.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local-cluster.sh"


@dataclass(frozen=True)
class Cluster:
    base: Path
    prefix: str
    login_host: str
    jail: Path
    """The jail on this machine's filesystem."""
    jail_root: str
    """Where the nodes see the jail."""
    private_key: Path
    host_key_file: Path
    slurm_conf: Path

    @property
    def workers(self) -> list[str]:
        return [f"{self.prefix}-n1", f"{self.prefix}-n2"]

    def on_host(self, node_path: str) -> Path:
        """This machine's path of a path inside the jail as the nodes see it."""
        return self.jail / Path(node_path).relative_to(self.jail_root)

    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)

    def stack_file(self, config_dir: Path, name: str, run_config: Path) -> Path:
        """stacks/Pulumi.cluster.yaml pointed at this cluster and the given run config, as stack `name`."""
        document = yaml.safe_load((ROOT / "stacks" / "Pulumi.cluster.yaml").read_text())
        config = document["config"]
        config["soperator-finetune:cluster"].update(
            loginHost=self.login_host, hostKeyFile=str(self.host_key_file), jailRoot=self.jail_root)
        config["soperator-finetune:pipeline"].update(
            runConfig=str(run_config), python=f"{self.jail_root}/opt/venv/bin/python")
        config_dir.mkdir(parents=True, exist_ok=True)
        path = config_dir / f"Pulumi.{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        return path


def _fail_or_skip(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[Cluster]:
    """A running 2-node cluster with its login node; fails in CI, skips elsewhere when it cannot start."""
    prefix = os.environ.get("LOCAL_CLUSTER_PREFIX", "ftc")
    base = Path(os.environ.get("LOCAL_CLUSTER_DIR", ROOT / ".local" / "cluster"))
    cluster = Cluster(
        base=base, prefix=prefix, login_host=f"{os.environ.get('LOCAL_CLUSTER_SUBNET', '10.213.0')}.3",
        jail=base / "jail", jail_root=f"/run/{prefix}/jail", private_key=base / "login" / "id_ed25519",
        host_key_file=base / "login" / "ssh_host_ed25519_key.pub", slurm_conf=base / "etc" / "slurm.conf",
    )
    was_running = cluster.script("status").returncode == 0
    try:
        started = cluster.script("start", "--nodes", "2", timeout=900)
    except (OSError, subprocess.TimeoutExpired) as error:
        _fail_or_skip(f"the rehearsal cluster did not start (scripts/local-cluster.sh start): {error}")
    if started.returncode != 0:
        _fail_or_skip(f"the rehearsal cluster did not start (scripts/local-cluster.sh start): {started.stderr[-2000:]}")
    try:
        yield cluster
    finally:
        if not was_running:
            cluster.script("stop")
