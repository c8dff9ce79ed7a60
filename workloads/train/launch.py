"""Shell settings for the train job: processes per node, checkpoint folder, NCCL/gloo network environment.

    eval "$(python -m workloads.train.launch --config RUN.json)"
    python -m workloads.train.launch --config RUN.json --stopped   # 0: the last attempt stopped with a checkpoint
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from documents.run_config import ConfigError, load_run_config
from documents.run_manifest import RUN_MANIFEST_NAME, load_run_manifest
from documents.sections.train import TrainConfig
from planning.memory import require_train
from workloads.train.config import train_paths


def procs_per_node(train: TrainConfig, gpus: int) -> int:
    """Configured count, else one process per GPU, else one."""
    return train.procs_per_node or gpus or 1


def gpu_count(dev: Path = Path("/dev")) -> int:
    """The CUDA devices torch sees; 0 without importing torch (2.5 s of CPU here) where `dev` has no NVIDIA device
    node, as CUDA cannot open a GPU without one."""
    if not any(dev.glob("nvidia[0-9]*")):
        return 0
    import torch

    return torch.cuda.device_count()


def launch_environment(train: TrainConfig, gpus: int, cpus_on_node: int) -> dict[str, str]:
    """Variables exported to every training process; CPU runs split the node's cores between processes."""
    nproc = procs_per_node(train, gpus)
    env = train.network.environment()
    if not gpus:
        env["OMP_NUM_THREADS"] = str(max(1, cpus_on_node // nproc))
    return env


def stopped_with_checkpoint(run_dir: Path) -> bool:
    """The run's last attempt stopped on request after its checkpoint was saved (status interrupted), the one end
    the train job requeues on: a failed save or a crash leaves the attempt running, and a requeue would loop."""
    manifest = load_run_manifest(run_dir / RUN_MANIFEST_NAME)
    return manifest is not None and manifest.status == "interrupted"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--stopped", action="store_true",
                        help="exit 0 when the last attempt stopped with a checkpoint (requeue), else 1")
    options = parser.parse_args(argv)
    try:
        run = load_run_config(options.config)
        train = require_train(run)
    except (ConfigError, ValueError) as error:
        print(f"launch: {error}", file=sys.stderr)
        return 2
    if options.stopped:
        return 0 if stopped_with_checkpoint(train_paths(run).run_dir) else 1
    gpus = gpu_count()
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
    paths = train_paths(run)
    lines = [
        f"FT_NPROC_PER_NODE={procs_per_node(train, gpus)}",
        f"FT_CHECKPOINT_DIR={shlex.quote(str(paths.checkpoint_dir))}",
        f"FT_RUN_DIR={shlex.quote(str(paths.run_dir))}",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(launch_environment(train, gpus, cpus).items())]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
