"""The trainer works on the oldest transformers and peft that pyproject.toml allows: those exact versions are
installed beside the venv (.local/floor/, once per machine, from PyPI) and put first on the path of a real
training run (gradient checkpointing, packed micro-batches, one checkpoint, the adapter)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from train_fixtures import with_train, write_config

ROOT = Path(__file__).resolve().parents[1]
# transformers 5.x needs huggingface-hub 1.x (>=1.5 from 5.17 on); the venv may hold a newer hub.
HUB = "huggingface-hub>=1.5,<2"


def floor_versions() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {}
    for line in deps:
        req = Requirement(line)
        if req.name in ("transformers", "peft"):
            [low] = [s.version for s in req.specifier if s.operator == ">="]
            floors[req.name] = low
    return floors


def floor_site(floors: dict[str, str]) -> Path:
    site = ROOT / ".local" / "floor" / "-".join(f"{k}{v}" for k, v in sorted(floors.items()))
    if site.is_dir():
        return site
    staging = site.with_name(site.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    pins = [f"{name}=={version}" for name, version in floors.items()]
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(staging), *pins,
                           HUB], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"could not install the floor versions {pins}: {proc.stderr[-2000:]}")
    staging.rename(site)
    return site


@pytest.mark.slow
def test_training_runs_on_the_floor_versions(tiny_prepared, tmp_path: Path) -> None:
    floors = floor_versions()
    assert set(floors) == {"transformers", "peft"}
    site = floor_site(floors)
    run = with_train(tiny_prepared, tmp_path, max_steps=2, save_steps=2, gradient_checkpointing=True,
                     batching="packed", micro_batch_tokens=256)
    config = write_config(run, tmp_path / "run.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-m", "workloads.train.finetune", "--config", str(config)],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((run.train_run_dir / "run_manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["global_step"] == 2
    assert all(Version(manifest["packages"][k]) == Version(v) for k, v in floors.items()), manifest["packages"]
    assert (run.adapter_dir / "adapter_model.safetensors").is_file()
