"""The existing-cluster stack target: its config section, the placement under the jail root, the SSH transport
spec with the pinned host key, and fetching a run's files back through a transport."""

from __future__ import annotations

from pathlib import Path

import pytest

from documents.run_config import load_run_config, parse_run_config
from infra.config import StackConfigError, load_stack_config, parse_stack_config
from infra.pipeline.chain import pipeline_jobs, code_location_for
from infra.pipeline.fetch import fetch_run
from infra.pipeline.runner import transport_spec
from infra.pipeline.transport import LocalTransport

REPO = Path(__file__).resolve().parents[1]
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBZXoof2CwLybfVERAHUrBsyLv4n0tOfk26uGtXZJBI/ login"


def cluster_values(**cluster: object) -> dict[str, object]:
    return {
        "target": "cluster",
        "cluster": {"loginHost": "192.0.2.7", "hostKey": HOST_KEY, "jailRoot": "/shared", "nodes": 3, **cluster},
        "pipeline": {"runConfig": "workloads/configs/cluster.json", "python": "/shared/venv/bin/python"},
    }


def test_stack_file_points_at_the_rehearsal_cluster() -> None:
    cfg = load_stack_config("cluster")
    assert cfg.target == "cluster" and cfg.cluster is not None
    assert (cfg.cluster.login_host, cfg.cluster.login_port, cfg.cluster.nodes) == ("10.213.0.3", 22, 2)
    assert cfg.cluster.jail_root == "/run/ftc/jail"


@pytest.mark.parametrize(("change", "message"), [
    ({"hostKey": None}, "set exactly one of hostKey and hostKeyFile"),
    ({"hostKeyFile": "k.pub"}, "set exactly one of hostKey and hostKeyFile"),
    ({"jailRoot": "shared"}, "jail root 'shared' must be an absolute path"),
    ({"jailRoot": "/run/ftc/../../etc"}, "jail root '/run/ftc/../../etc' must not contain '..'"),
    ({"nodes": 0}, "cluster.nodes"),
])
def test_bad_cluster_sections_are_named(change: dict[str, object], message: str) -> None:
    values = cluster_values()
    values["cluster"] = {k: v for k, v in {**values["cluster"], **change}.items() if v is not None}
    with pytest.raises(StackConfigError, match=message):
        parse_stack_config("c", values, "stacks/Pulumi.c.yaml")


def test_cluster_section_only_on_cluster_stacks() -> None:
    with pytest.raises(StackConfigError, match="cluster: required on a cluster stack"):
        parse_stack_config("c", {**cluster_values(), "cluster": None}, "f")
    with pytest.raises(StackConfigError, match="only a cluster stack reaches an existing Slurm cluster"):
        parse_stack_config("c", {**cluster_values(), "target": "local"}, "f")


def test_placement_is_under_the_jail_root_and_spreads_over_the_nodes() -> None:
    cfg = parse_stack_config("c", cluster_values(cpusPerNode=4), "f")
    run = load_run_config(REPO / "workloads/configs/cluster.json")
    placement = code_location_for(cfg, run, REPO)
    assert placement.code_root == "/shared/home/shared/finetune_code"
    assert placement.env == {"FT_ROOT": "/shared/mnt/data/cluster"} and placement.slurm_env == {}
    jobs = {job.stage: job for job in pipeline_jobs(cfg, run, "workloads/configs/cluster.json", "c0de", placement)}
    assert jobs["readiness"].extra_args == jobs["train"].extra_args == [
        "--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=4"]
    assert jobs["prepare"].extra_args == ["--cpus-per-task=4"]
    assert jobs["eval"].extra_args == ["--nodes=1", "--cpus-per-task=4"]
    assert jobs["train"].metrics_path == "/shared/mnt/data/cluster/outputs/cluster/metrics.jsonl"
    absolute = parse_run_config({**run.model_dump(mode="json"), "paths": {"root": "/scratch/ft"}}, "x")
    assert code_location_for(cfg, absolute, REPO).env == {"FT_ROOT": "/scratch/ft"}


def test_transport_is_ssh_to_the_login_node_with_the_pinned_key(tmp_path: Path) -> None:
    (tmp_path / "login.pub").write_text(HOST_KEY + "\n")
    cfg = parse_stack_config("c", cluster_values(hostKey=None, hostKeyFile="login.pub", user="ft", loginPort=2222), "f")
    spec = transport_spec(cfg, private_key="KEY", repo_root=tmp_path)
    assert spec == {"kind": "ssh", "host": "192.0.2.7", "user": "ft", "port": 2222, "private_key": "KEY",
                    "host_key": HOST_KEY, "known_hosts": None}
    assert transport_spec(cfg, login_host="198.51.100.1", private_key="KEY", repo_root=tmp_path)["host"] == "198.51.100.1"
    with pytest.raises(ValueError, match="--ssh-key"):
        transport_spec(cfg, repo_root=tmp_path)
    with pytest.raises(StackConfigError, match="cannot read the pinned host key"):
        transport_spec(cfg, private_key="KEY", repo_root=tmp_path / "elsewhere")


def test_fetch_brings_back_the_run_files_byte_for_byte(tmp_path: Path) -> None:
    train, results = tmp_path / "remote/train", tmp_path / "remote/results"
    train.mkdir(parents=True)
    results.mkdir(parents=True)
    chart = bytes(range(256)) * 4
    (train / "metrics.jsonl").write_text('{"step": 1}\n')
    (train / "run_manifest.json").write_text("{}")
    (train / "loss.png").write_bytes(chart)
    (train / "optimizer.pt").write_bytes(b"not an artifact")
    (results / "evaluator_12.json").write_text("{}")
    (results / "evaluator_12.png").write_bytes(chart)
    (results / "evaluator_11.json").write_text("{}")
    got_train, got_results = fetch_run(LocalTransport(), str(train), str(results), "12", tmp_path / "local")
    assert sorted(p.name for p in got_train.iterdir()) == ["loss.png", "metrics.jsonl", "run_manifest.json"]
    assert sorted(p.name for p in got_results.iterdir()) == ["evaluator_12.json", "evaluator_12.png"]
    assert (got_train / "loss.png").read_bytes() == chart == (got_results / "evaluator_12.png").read_bytes()
    empty_train, _ = fetch_run(LocalTransport(), str(tmp_path / "missing"), str(results), "12", tmp_path / "again")
    assert list(empty_train.iterdir()) == []


def test_program_ships_the_pipeline_over_ssh_with_the_pinned_key_as_a_secret() -> None:
    from infra.program.mocks import run_under_mocks

    secret = {"pipelineSshPrivateKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-key\n-----END OPENSSH PRIVATE KEY-----"}
    cfg = parse_stack_config("c", cluster_values(), "f")
    run = run_under_mocks(cfg, secrets=secret)
    assert run.outputs["target"] == "cluster" and run.outputs["slurm_target"] == "existing"
    jobs = {r.name.rsplit("-", 1)[-1]: r for r in run.resources if r.type == "pulumi-python:dynamic:Resource"}
    assert jobs["bundle"].inputs["code_root"] == "/shared/home/shared/finetune_code"
    assert jobs["train"].inputs["extra_args"] == ["--nodes=3", "--ntasks-per-node=1", "--cpus-per-task=1"]
    assert jobs["train"].inputs["transport"] == "[secret]"
    assert not any(r.type.startswith(("nebius:", "kubernetes:")) for r in run.resources)
    without_key = run_under_mocks(cfg)
    assert "pipeline_train_job_id" not in without_key.outputs
