"""Readiness checks of the workloads' environment on a node: the imports the workloads make, the versions the lock
names, torch's CUDA build against the stack's CUDA version, bitsandbytes' CUDA kernels and NCCL; and where the job
names a serving environment ($FT_VLLM_PYTHON, a chain that serves on GPUs), vLLM imported from it at its lock's
versions.

The lock is the copy the environment stage keeps beside the interpreter (`<sys.prefix>/requirements.txt`); an
interpreter without one (the local stack's repository venv) has its versions reported as skipped.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from documents.environment_manifest import LOCK_COPY_NAME
from documents.readiness_report import CheckResult
from workloads.environment.build import INSTALLED_VERSIONS

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", re.M)
PROJECT_PACKAGES = {"workloads", "planning", "documents"}
SERVING_PYTHON_ENV = "FT_VLLM_PYTHON"
SERVING_IMPORT_TIMEOUT_S = 600
SERVING_QUERY = ("import sys\nimport vllm\n" + INSTALLED_VERSIONS
                 + 'print(json.dumps({"prefix": sys.prefix, "vllm": vllm.__version__, "packages": found}))\n')
"""Run by the serving environment's interpreter: vLLM imported, and each distribution's version as import finds it."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(text: str) -> dict[str, str]:
    """{normalized name: version} of a hashed requirements file."""
    return {normalize(name): version for name, version in _PIN.findall(text)}


def installed_versions() -> dict[str, str]:
    """{normalized name: version} of the copy `import` finds: the first on sys.path. In an environment over an image's
    packages (`--system-site-packages`) the environment's own site-packages come before the image's, whose shadowed
    copies are skipped."""
    found: dict[str, str] = {}
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"]
        if name:
            found.setdefault(normalize(name), distribution.version)
    return found


def version_mismatches(locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    """'name: wanted X, found Y' for every locked package installed at another version (or not at all)."""
    return [f"{name}: wanted {version}, found {installed.get(name, 'none')}"
            for name, version in sorted(locked.items()) if installed.get(name) != version]


def third_party_imports(code_dir: Path) -> list[str]:
    """The top-level modules the shipped packages under code_dir import that are neither the standard library nor
    their own."""
    found: set[str] = set()
    for path in sorted(p for package in sorted(PROJECT_PACKAGES) for p in (code_dir / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return sorted(found - set(sys.stdlib_module_names) - PROJECT_PACKAGES - {"__future__"})


def _check(name: str, ok: bool | None, detail: str, value: str | None = None) -> CheckResult:
    status = "skip" if ok is None else "pass" if ok else "fail"
    return CheckResult(name=name, status=status, node=socket.gethostname(), value=value, detail=detail)


def import_check(modules: list[str], optional: frozenset[str]) -> CheckResult:
    """Every module imports; `optional` ones (a GPU-only extra, an engine installed where it is used) may be absent."""
    failed = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if module not in optional or error.name != module:
                failed.append(f"{module} ({error})")
        except Exception as error:  # noqa: BLE001 - any import-time failure is the finding
            failed.append(f"{module} ({type(error).__name__}: {error})")
    return _check("environment_imports", not failed, "; ".join(failed) or f"{len(modules)} modules import",
                  str(len(modules)))


def versions_check(lock_file: Path) -> CheckResult:
    if not lock_file.is_file():
        return _check("environment_versions", None, f"no lock beside the interpreter ({lock_file}): not an "
                      "environment the pipeline built")
    mismatches = version_mismatches(locked_versions(lock_file.read_text()), installed_versions())
    return _check("environment_versions", not mismatches,
                  "; ".join(mismatches) or f"every package at the version of {lock_file}")


def cuda_checks(expect_cuda: str | None, gpus: bool, allow_cpu: bool) -> list[CheckResult]:
    """torch's CUDA build equals the stack's CUDA version (major.minor); bitsandbytes' CUDA kernels run; NCCL is
    there. On a node without GPUs they are skipped when CPU runs are allowed, and fail otherwise."""
    import torch

    if not gpus:
        why = "no GPU on this node" + ("" if allow_cpu else " (and CPU runs are not allowed)")
        state = None if allow_cpu else False
        return [_check(name, state, why) for name in ("torch_cuda_build", "bitsandbytes_cuda", "nccl")]
    build = torch.version.cuda
    wanted = ".".join(expect_cuda.split(".")[:2]) if expect_cuda else None
    checks = [_check("torch_cuda_build", build is not None and (wanted is None or build == wanted),
                     f"torch {torch.__version__} built for CUDA {build}; the stack's CUDA is {wanted or 'not given'}",
                     build)]
    try:
        import bitsandbytes.functional as bnb_functional

        packed, _state = bnb_functional.quantize_4bit(torch.ones(64, 64, device="cuda", dtype=torch.float16))
        checks.append(_check("bitsandbytes_cuda", packed.is_cuda, "4-bit quantization ran on the GPU"))
    except Exception as error:  # noqa: BLE001 - a missing or broken kernel library is the finding
        checks.append(_check("bitsandbytes_cuda", False, f"{type(error).__name__}: {error}"))
    nccl = torch.distributed.is_nccl_available() and hasattr(torch.cuda, "nccl")
    version = ".".join(map(str, torch.cuda.nccl.version())) if nccl else None
    checks.append(_check("nccl", nccl, f"NCCL {version}" if nccl else "torch has no NCCL", version))
    return checks


def serving_check(python: str) -> CheckResult:
    """vLLM imports in the serving environment whose interpreter is `python`, and every package there is at the
    version of the serving lock the environment stage kept beside it (`<prefix>/requirements.txt`)."""
    name = "serving_environment"
    try:
        proc = subprocess.run([python, "-c", SERVING_QUERY], capture_output=True, text=True,
                              timeout=SERVING_IMPORT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        return _check(name, False, f"{python}: {error}")
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["(no output)"]
        return _check(name, False, f"vLLM does not import with {python}: {tail[0][:300]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    lock_file = Path(found["prefix"]) / LOCK_COPY_NAME
    if not lock_file.is_file():
        return _check(name, None, f"vLLM {found['vllm']} imports with {python}; no lock beside it ({lock_file}): not "
                      "an environment the pipeline built", found["vllm"])
    mismatches = version_mismatches(locked_versions(lock_file.read_text()), found["packages"])
    return _check(name, not mismatches, "; ".join(mismatches) or f"vLLM {found['vllm']} imports with {python}, every "
                  f"package at the version of {lock_file}", found["vllm"])


def environment_checks(code_dir: Path, expect_cuda: str | None, gpus: bool, allow_cpu: bool) -> list[CheckResult]:
    """Every environment check of this node, the serving environment's where the job names one."""
    optional = frozenset({"vllm", "liger_kernel", "pynvml", "playwright", "triton"})
    serving = os.environ.get(SERVING_PYTHON_ENV)
    return [import_check(third_party_imports(code_dir), optional),
            versions_check(Path(sys.prefix) / LOCK_COPY_NAME), *cuda_checks(expect_cuda, gpus, allow_cpu),
            *([serving_check(serving)] if serving else [])]
