"""The multi-node rehearsal cluster (scripts/local-cluster.sh) for the `cluster` stack tests (pytest plugin).

One cluster per test session: started when not already running (and then stopped at the end), left alone when
it was. Its layout follows the script's environment (LOCAL_CLUSTER_PREFIX, LOCAL_CLUSTER_SUBNET, LOCAL_CLUSTER_DIR).
Without LOCAL_CLUSTER_PREFIX, a bridge of the default name that another cluster made (another checkout's, or one
left by a machine image) moves this one to the next free prefix and subnet instead of failing on it.
In CI (CI=true) a cluster that cannot start fails the tests; elsewhere (no root, no namespaces) they skip.
"""

from __future__ import annotations

import os
import shutil
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
        """The Slurm nodes: the worker pods of the values the cluster started from (<dir>/etc/pods), in order."""
        return [line.split()[0] for line in (self.base / "etc" / "pods").read_text().splitlines()]

    @property
    def serving_node(self) -> str:
        """The node the cluster reserves for serving (`start --serving-nodes 1`: NodeSet worker-serve, sorted last,
        partition serve)."""
        return self.workers[-1]

    @property
    def training_workers(self) -> list[str]:
        """The nodes of partition main, the default one (NodeSet worker): where a stack without serving nodes runs."""
        return self.workers[:-1]

    def on_host(self, node_path: str) -> Path:
        """This machine's path of a path inside the jail as the nodes see it."""
        return self.jail / Path(node_path).relative_to(self.jail_root)

    @property
    def subnet(self) -> str:
        return self.login_host.rsplit(".", 1)[0]

    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "LOCAL_CLUSTER_DIR": str(self.base), "LOCAL_CLUSTER_PREFIX": self.prefix,
               "LOCAL_CLUSTER_SUBNET": self.subnet}
        return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)

    def stack_file(self, config_dir: Path, name: str, run_config: Path, serving_nodes: int = 0) -> Path:
        """stacks/Pulumi.cluster.yaml pointed at this cluster and the given run config, as stack `name`; with
        `serving_nodes`, that many workers reserved for serving (the partitions the cluster starts with)."""
        document = yaml.safe_load((ROOT / "stacks" / "Pulumi.cluster.yaml").read_text())
        config = document["config"]
        if serving_nodes:
            config["soperator-finetune:serving"] = {"nodes": serving_nodes}
        config["soperator-finetune:cluster"].update(
            loginHost=self.login_host, hostKeyFile=str(self.host_key_file), jailRoot=self.jail_root)
        config["soperator-finetune:pipeline"].update(runConfig=str(run_config))
        config_dir.mkdir(parents=True, exist_ok=True)
        path = config_dir / f"Pulumi.{name}.yaml"
        path.write_text(yaml.safe_dump(document))
        return path


def _fail_or_skip(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def _taken_by_another(base: Path, prefix: str, subnet: str) -> bool:
    """Whether the bridge of `prefix` or the subnet is in use by something the cluster in `base` did not make."""
    created = base / "run" / "created"
    if shutil.which("ip") is None:
        return False
    if created.exists() and f"link:{prefix}-br" in created.read_text().split():
        return False
    bridge = subprocess.run(["ip", "link", "show", f"{prefix}-br"], capture_output=True)
    routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
    return bridge.returncode == 0 or f"{subnet}.0/24" in routes


START = ("--nodes", "3", "--serving-nodes", "1")
"""How the tests' cluster starts (tests that stop it start it again so)."""
DEFAULT_IDENTITIES = [("ftc", "10.213.0")] + [(f"ftc{n}", f"10.213.{n}") for n in range(1, 10)]


def own_identity(base: Path) -> tuple[str, str] | None:
    """The prefix and subnet of the cluster `base` holds now: the bridge its `run/created` records, where that bridge
    still exists, with the /24 of its address (None: no cluster of this folder is up)."""
    created = base / "run" / "created"
    if not created.exists() or shutil.which("ip") is None:
        return None
    for entry in created.read_text().split():
        if entry.startswith("link:") and entry.endswith("-br"):
            bridge = entry.removeprefix("link:")
            shown = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", bridge], capture_output=True, text=True)
            address = shown.stdout.split(" inet ", 1)[1].split("/", 1)[0] if " inet " in shown.stdout else None
            if shown.returncode == 0 and address:
                return bridge.removesuffix("-br"), address.rsplit(".", 1)[0]
    return None


def free_identity(base: Path, candidates: list[tuple[str, str]] = DEFAULT_IDENTITIES) -> tuple[str, str]:
    """The prefix and subnet: the environment's, else those of the cluster `base` already runs (one started under
    another prefix by an earlier session), else the first candidate no other cluster holds."""
    if "LOCAL_CLUSTER_PREFIX" in os.environ:
        return os.environ["LOCAL_CLUSTER_PREFIX"], os.environ.get("LOCAL_CLUSTER_SUBNET", "10.213.0")
    if (running := own_identity(base)) is not None:
        return running
    for prefix, subnet in candidates:
        if not _taken_by_another(base, prefix, subnet):
            return prefix, subnet
    return candidates[0]


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[Cluster]:
    """A running cluster with its login node, made from the `cluster` stack's values with 3 nodes, one reserved for
    serving: worker-0 and worker-1 in partition main (the default; a stack without serving nodes trains on both),
    worker-serve-0 in serve. Fails in CI, skips elsewhere when it cannot start."""
    base = Path(os.environ.get("LOCAL_CLUSTER_DIR", ROOT / ".local" / "cluster"))
    prefix, subnet = free_identity(base)
    cluster = Cluster(
        base=base, prefix=prefix, login_host=f"{subnet}.3",
        jail=base / "jail", jail_root=f"/run/{prefix}/jail", private_key=base / "login" / "id_ed25519",
        host_key_file=base / "login" / "ssh_host_ed25519_key.pub", slurm_conf=base / "etc" / "slurm.conf",
    )
    was_running = cluster.script("status").returncode == 0
    try:
        started = cluster.script("start", *START, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as error:
        _fail_or_skip(f"the rehearsal cluster did not start (scripts/local-cluster.sh start): {error}")
    if started.returncode != 0:
        _fail_or_skip(f"the rehearsal cluster did not start (scripts/local-cluster.sh start): {started.stderr[-2000:]}")
    try:
        yield cluster
    finally:
        if not was_running:
            cluster.script("stop")
