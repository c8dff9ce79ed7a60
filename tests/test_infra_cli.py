"""`ftstack plan`: the offline plan through the real console entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.commands.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_plan_demo_lists_the_seed_000_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "demo"]) == 0
    text = capsys.readouterr().out
    assert "pulumi preview --stack demo" in text
    assert "preset=2gpu-64vcpu-384gb" in text and 'autoscaling={"minNodeCount": 0, "maxNodeCount": 5}' in text
    assert "bootDisk=558 GiB NETWORK_SSD_NON_REPLICATED" in text
    for fs in ("innovationbank-fs-jail-submount-data", "innovationbank-fs-controller-spool", "innovationbank-fs-accounting"):
        assert fs in text
    assert "kubeconfig = [secret]" in text
    assert "BEGIN CERTIFICATE" not in text and "certificate-authority-data" not in text


def test_plan_json_has_resources_and_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "h100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    kinds = {r["type"].rsplit(":", 1)[-1] for r in doc["resources"]}
    assert {"Mk8sV1Cluster", "Mk8sV1NodeGroup", "ComputeV1GpuCluster", "Release"} <= kinds
    worker = next(r for r in doc["resources"] if r["name"] == "ft-h100-worker")
    assert worker["properties"]["platform"] == "gpu-h100-sxm" and worker["properties"]["autoscaling"] == {
        "minNodeCount": 0, "maxNodeCount": 2}
    assert doc["outputs"]["gpus_total"] == 16 and doc["outputs"]["kubeconfig"] == "[secret]"


def test_bad_stack_file_fails_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = yaml.safe_load((ROOT / "stacks/Pulumi.demo.yaml").read_text())
    document["config"]["soperator-finetune:filesystems"]["submounts"][0]["mountPath"] = "data"
    (tmp_path / "Pulumi.demo.yaml").write_text(yaml.safe_dump(document))
    assert main(["plan", "--stack", "demo", "--config-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Pulumi.demo.yaml" in err and "soperator-finetune:filesystems.submounts.0.mountPath" in err


def test_console_script_runs_local_plan_without_cloud() -> None:
    ftstack = Path(sys.executable).with_name("ftstack")
    result = subprocess.run([str(ftstack), "plan", "--stack", "local"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Monthly cost: $0 (no cloud resources on this stack)" in result.stdout
    assert "slurm_target = local" in result.stdout and "local-pipeline-train" in result.stdout


def test_program_module_imports_without_cloud_access() -> None:
    code = "import infra.program.build, infra.soperator.component, infra.nebius.cluster; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert result.stdout.strip() == "ok", result.stderr


def test_cost_stack_comes_from_the_config_dir_or_else_the_repository_stacks(tmp_path: Path) -> None:
    from infra.commands.run import cost_stack_config

    own = tmp_path / "my-stacks"
    own.mkdir()
    (own / "Pulumi.local.yaml").write_text((ROOT / "stacks" / "Pulumi.local.yaml").read_text())
    assert cost_stack_config("demo", ROOT, own).stack == "demo"
    (own / "Pulumi.demo.yaml").write_text((ROOT / "stacks" / "Pulumi.local.yaml").read_text())
    assert cost_stack_config("demo", ROOT, own).target == "local"


@pytest.mark.parametrize("command", ["run", "status"])
def test_a_named_subcommand_loads_neither_the_pulumi_program_nor_matplotlib(command: str) -> None:
    """`ftstack run` is called by every pipeline step and test; the program's providers and the charts' library
    cost it two of its three seconds here and it needs neither to parse its arguments."""
    probe = ("import sys; from infra.commands.cli import build_parser, named_command; "
             f"build_parser(named_command(['{command}'])).parse_args(['{command}', '--stack', 'local']); "
             "print(sorted(m for m in ('pulumi_nebius', 'matplotlib', 'infra.program.build') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_help_without_a_subcommand_lists_every_subcommand() -> None:
    done = subprocess.run([sys.executable, "-m", "infra.commands.cli", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for name in ("plan", "bootstrap-backend", "runs", "report", "run", "status"):
        assert f"    {name}" in done.stdout
