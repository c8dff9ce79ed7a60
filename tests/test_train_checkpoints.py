"""Checkpoint sealing, validation, pruning and the launch environment (pure parts, no training)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from documents.sections.train import NetworkConfig, TrainConfig
from workloads.train import checkpoints
from workloads.train.launch import launch_environment, procs_per_node


def _staged(root: Path, step: int) -> Path:
    folder = root / f"{checkpoints.STAGING}{step}" / f"{checkpoints.PREFIX}{step}"
    folder.mkdir(parents=True)
    save_file({"w": torch.ones(4)}, str(folder / "adapter_model.safetensors"))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_publish_then_prune_keeps_newest_intact(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        checkpoints.publish(_staged(tmp_path, step), tmp_path, step)
    broken = tmp_path / "checkpoint-5"
    broken.mkdir()
    (tmp_path / f"{checkpoints.STAGING}10").mkdir()
    newer_broken = tmp_path / "checkpoint-10"
    newer_broken.mkdir()
    checkpoints.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-6", "checkpoint-8"]
    assert checkpoints.latest_complete(tmp_path) == tmp_path / "checkpoint-8"


def test_problem_detects_tampering(tmp_path: Path) -> None:
    folder = checkpoints.publish(_staged(tmp_path, 3), tmp_path, 3)
    assert checkpoints.problem(folder) is None
    (folder / "trainer_state.json").write_text("{}")
    assert "trainer_state.json is 2 bytes" in checkpoints.problem(folder)
    (folder / checkpoints.MARKER).write_text("{not json")
    assert "unreadable completion marker" in checkpoints.problem(folder)
    (folder / checkpoints.MARKER).write_text(json.dumps({"step": 3, "sealed": "2026-11-25T00:00:00Z"}))
    assert checkpoints.problem(folder) == (f"unreadable completion marker: {folder / 'COMPLETE.json'}: not a valid "
                                           "checkpoint completion marker (files: Field required)")
    assert checkpoints.latest_complete(tmp_path) is None
    assert checkpoints.latest_complete(tmp_path / "missing") is None


def test_corrupt_weights_with_matching_sizes_are_caught(tmp_path: Path) -> None:
    folder = checkpoints.publish(_staged(tmp_path, 1), tmp_path, 1)
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(b"\xff" * weights.stat().st_size)
    assert "cannot be read" in checkpoints.problem(folder)


def test_network_environment_per_fabric() -> None:
    ethernet = NetworkConfig(fabric="ethernet", socket_ifname="eth0").environment()
    assert ethernet["NCCL_IB_DISABLE"] == "1" and ethernet["NCCL_SOCKET_IFNAME"] == "eth0"
    assert ethernet["GLOO_SOCKET_IFNAME"] == "eth0"
    ib = NetworkConfig(fabric="infiniband", ib_hca="mlx5", extra_env={"NCCL_NET_GDR_LEVEL": "PHB"}).environment()
    assert ib["NCCL_IB_DISABLE"] == "0" and ib["NCCL_IB_HCA"] == "mlx5" and ib["NCCL_NET_GDR_LEVEL"] == "PHB"
    assert "NCCL_SOCKET_IFNAME" not in ib


def test_processes_and_threads_per_node() -> None:
    cpu = TrainConfig(procs_per_node=2)
    assert procs_per_node(cpu, gpus=0) == 2
    assert launch_environment(cpu, gpus=0, cpus_on_node=8)["OMP_NUM_THREADS"] == "4"
    assert procs_per_node(TrainConfig(), gpus=8) == 8
    assert "OMP_NUM_THREADS" not in launch_environment(TrainConfig(), gpus=8, cpus_on_node=128)
    assert procs_per_node(TrainConfig(), gpus=0) == 1


COUNT_GPUS = """import sys
from pathlib import Path
from workloads.train.launch import gpu_count
print(gpu_count(Path(sys.argv[1])), "torch" in sys.modules)"""


def test_gpus_are_counted_by_torch_only_where_an_nvidia_device_node_exists(tmp_path: Path) -> None:
    """No /dev/nvidiaN: no GPU and torch is not imported (the launch step runs on every node of every training
    job); with one, the count is torch's own."""
    def counted(dev: Path) -> list[str]:
        done = subprocess.run([sys.executable, "-c", COUNT_GPUS, str(dev)], capture_output=True, text=True,
                              timeout=300, cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.split()

    (tmp_path / "nvidia-caps").mkdir()  # not a GPU's node
    assert counted(tmp_path) == ["0", "False"]
    (tmp_path / "nvidia0").touch()
    assert counted(tmp_path) == [str(torch.cuda.device_count()), "True"]


def test_checkpoint_of_another_configuration_is_not_resumed(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    from documents.run_manifest import training_fingerprint

    base = {"model": {"source": "dir:/m"}, "data": {"rows": 4}, "train": {"lora": {"r": 8}, "max_steps": 10}}
    longer = {**base, "train": {"lora": {"r": 8}, "max_steps": 20}}
    other = {**base, "train": {"lora": {"r": 16}, "max_steps": 10}}
    assert training_fingerprint(base) == training_fingerprint(longer)
    assert training_fingerprint(base) != training_fingerprint(other)
    checkpoints.publish(_staged(tmp_path, 5), tmp_path, 5, training_fingerprint(base))
    assert checkpoints.latest_complete(tmp_path, training_fingerprint(longer)) == tmp_path / "checkpoint-5"
    assert checkpoints.latest_complete(tmp_path, training_fingerprint(other)) is None
    assert "written by a different training configuration" in caplog.text


def test_a_checkpoint_of_the_other_strategy_is_refused_and_another_rank_count_noted(tmp_path: Path) -> None:
    ddp = tmp_path / "ddp" / "checkpoint-4"
    fsdp = tmp_path / "fsdp" / "checkpoint-4"
    for folder, ranks in ((ddp, 2), (fsdp, 2)):
        folder.mkdir(parents=True)
        for rank in range(ranks):
            (folder / f"rng_state_{rank}.pth").write_bytes(b"x")
    (fsdp / checkpoints.FSDP_MODEL).mkdir()
    (fsdp / checkpoints.FSDP_MODEL / "__0_0.distcp").write_bytes(b"x")
    assert checkpoints.written_by(ddp) == ("ddp", 2) and checkpoints.written_by(fsdp) == ("fsdp", 2)
    assert checkpoints.check_resumable(fsdp, "fsdp", 2) is None
    with pytest.raises(checkpoints.CannotResume, match="written under ddp and this run trains under fsdp: set "
                                                        "train.parallelism: ddp"):
        checkpoints.check_resumable(ddp, "fsdp", 2)
    with pytest.raises(checkpoints.CannotResume, match="needs 2 or more ranks"):
        checkpoints.check_resumable(fsdp, "ddp", 1)
    note = checkpoints.check_resumable(fsdp, "fsdp", 4)
    assert note is not None and "written by 2 ranks, resuming on 4" in note and "resharded" in note
