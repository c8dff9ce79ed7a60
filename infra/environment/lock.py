"""The workloads' lock: pyproject's dependencies resolved by uv to exact versions and hashes, per target.

One source (pyproject.toml) -> one folder (locks/) holding a hashed requirements file per target:
  local  this machine (Python 3.11, torch's CPU build from the find-links folder), dev extra included;
         `make venv` installs it and the rehearsal cluster's environment is built from it.
  jail   Soperator's jail (Python 3.12, manylinux x86_64, torch's CUDA build for the stacks' cudaVersion), gpu
         extra included, resolved from PyPI alone (the URLs a cluster can reach) with the local lock's versions
         as constraints, so both targets share every version they have in common.
Each target is written twice from one resolution: hashed requirements (what installers read) and a PEP 751
`pylock.<target>.toml` (the wheel uv chose per package, by URL and hash: what the wheelhouse downloads).
`locks/lock.json` records the digest of pyproject's dependency tables the files were compiled from.

Standard library only: `make venv` runs `python -m infra.environment.lock sync` before anything is installed.
  python -m infra.environment.lock compile   regenerate every target (make lock)
  python -m infra.environment.lock sync PY   install the local target into the venv of PY, hashes checked
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK_DIR = ROOT / "locks"
LOCK_META = LOCK_DIR / "lock.json"
UV_VERSION = "0.13.9"


@dataclass(frozen=True)
class Target:
    """One platform the lock resolves for."""

    name: str
    python: str
    platform: str
    """uv's --python-platform; the wheel tag family the target installs."""
    torch: str
    """torch's exact build: the CPU wheel here, PyPI's CUDA build on the jail."""
    cuda: str | None
    """CUDA major.minor of that torch build (None: CPU)."""
    extras: tuple[str, ...]
    pypi_only: bool

    @property
    def file(self) -> Path:
        """The hashed requirements file (pip, uv pip sync)."""
        return LOCK_DIR / f"requirements-{self.name}.txt"

    @property
    def pylock(self) -> Path:
        """The same resolution as a PEP 751 lock: each package's chosen wheel (URL, hash) for this platform."""
        return LOCK_DIR / f"pylock.{self.name}.toml"


TARGETS: dict[str, Target] = {
    # this machine's glibc is 2.36: its package mirror holds some releases only as manylinux_2_34 wheels
    "local": Target("local", "3.11", "x86_64-manylinux_2_34", "2.13.0+cpu", None, ("dev",), pypi_only=False),
    # torch 2.13.0 on PyPI is built for CUDA 13.0 (torch/version.py of its cp312 manylinux_2_28 wheel: '2.13.0+cu130')
    "jail": Target("jail", "3.12", "x86_64-manylinux_2_28", "2.13.0", "13.0", ("gpu",), pypi_only=True),
}
WHEEL_PLATFORM = {"x86_64-manylinux_2_28": "manylinux_2_28_x86_64", "x86_64-manylinux_2_34": "manylinux_2_34_x86_64"}
"""pip download's --platform for a target's uv --python-platform."""

PURE_SDISTS = frozenset({"rouge-score"})
"""Packages PyPI ships as a source archive only, of pure Python (rouge-score 0.1.2: setup.py, no extension)."""
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def normalize(name: str) -> str:
    """PEP 503 name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_digest(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """sha256 of pyproject's dependencies and optional dependencies (what the lock is compiled from)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    payload = {"dependencies": project.get("dependencies", []),
               "optional-dependencies": project.get("optional-dependencies", {})}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def lock_hash(path: Path) -> str:
    """The environment's key part for a lock file: sha256 of its bytes (first 16 hex digits)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def pins(text: str) -> dict[str, str]:
    """{normalized name: version} of a hashed requirements file."""
    found = {}
    for line in text.splitlines():
        match = _PIN.match(line)
        if match:
            found[normalize(match.group(1))] = match.group(2)
    return found


def public_version(version: str) -> str:
    """A version without its local label (2.13.0+cpu -> 2.13.0)."""
    return version.split("+", 1)[0]


def version_disagreements(first: dict[str, str], second: dict[str, str]) -> list[str]:
    """'name: a != b' for every package both pin at different public versions."""
    return [f"{name}: {first[name]} != {second[name]}" for name in sorted(first.keys() & second.keys())
            if public_version(first[name]) != public_version(second[name])]


def pip_sources() -> list[str]:
    """uv arguments for the find-links folders and extra indexes this machine's pip is configured with."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    args: list[str] = []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        values = value.strip().strip("'\"").split()
        if key.endswith(".find-links"):
            args += [arg for v in values for arg in ("--find-links", v)]
        elif key.endswith(".extra-index-url"):
            args += [arg for v in values for arg in ("--extra-index-url", v)]
    env_links = os.environ.get("PIP_FIND_LINKS", "").split()
    args += [arg for v in env_links if v not in args for arg in ("--find-links", v)]
    return args


def uv_binary() -> str:
    """uv beside this interpreter (the venv's, from the dev extra), else on PATH."""
    local = Path(sys.executable).parent / "uv"
    return str(local) if local.exists() else "uv"


class LockError(ValueError):
    """The lock cannot serve a target; the message names the package and the platform."""


def wheel_gaps(pylock: dict, target: Target) -> list[str]:
    """'name version' of each package a PEP 751 lock resolves for `target` with no wheel for its platform,
    pure-Python sdists (PURE_SDISTS) excepted: the wheelhouse builds those (py3-none-any) on the operator's
    machine and pip builds them on a cluster that reaches the index."""
    return [f"{p['name']} {p['version']}" for p in pylock.get("packages", [])
            if not p.get("wheels") and normalize(p["name"]) not in PURE_SDISTS]


def refuse_wheel_gaps(gaps: list[str], target: Target) -> None:
    if gaps:
        raise LockError(f"no wheel for Python {target.python} {WHEEL_PLATFORM[target.platform]}: {', '.join(gaps)}"
                        " (the cluster installs wheels only; pin a version that ships one)")


def _uv_compile(target: Target, constraints: Path | None, output: Path, tmp: Path) -> None:
    override = tmp / "torch.txt"
    override.write_text(f"torch=={target.torch}\n")
    command = [
        uv_binary(), "pip", "compile", str(ROOT / "pyproject.toml"), "--quiet", "--generate-hashes",
        "--no-header", "--no-annotate", "--python-version", target.python,
        "--python-platform", target.platform, "--override", str(override), "-o", str(output),
        *[arg for extra in target.extras for arg in ("--extra", extra)],
        *(["--constraint", str(constraints)] if constraints else []),
        *(["--index-strategy", "unsafe-best-match", *pip_sources()] if not target.pypi_only else []),
    ]
    subprocess.run(command, check=True, env={**os.environ, "UV_NO_CONFIG": "1"})


def compile_target(target: Target, constraints: Path | None) -> None:
    """uv pip compile pyproject for one target into its lock file, after checking (through the same resolution
    written as a PEP 751 lock, which lists each package's wheels for the platform) that every package has a wheel
    for the target's Python and platform."""
    with tempfile.TemporaryDirectory(prefix="ft-lock-") as tmp:
        _uv_compile(target, constraints, target.pylock, Path(tmp))
        refuse_wheel_gaps(wheel_gaps(tomllib.loads(target.pylock.read_text()), target), target)
        _uv_compile(target, constraints, target.file, Path(tmp))


def compile_all() -> None:
    """Regenerate every target: local first, then the jail constrained to the local versions."""
    LOCK_DIR.mkdir(exist_ok=True)
    local = TARGETS["local"]
    compile_target(local, None)
    with tempfile.TemporaryDirectory(prefix="ft-lock-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("".join(f"{name}=={public_version(version)}\n"
                                       for name, version in pins(local.file.read_text()).items() if name != "torch"))
        compile_target(TARGETS["jail"], constraints)
    LOCK_META.write_text(json.dumps({"pyproject_sha256": pyproject_digest(), "uv": UV_VERSION,
                                     "targets": {name: {"python": t.python, "platform": t.platform, "torch": t.torch,
                                                        "cuda": t.cuda, "file": t.file.name}
                                                 for name, t in TARGETS.items()}}, indent=2) + "\n")


def sync(python: str) -> None:
    """Install the local lock into the venv of `python` with uv (hashes required, nothing else left in it)."""
    uv = str(Path(python).parent / "uv")
    subprocess.run([uv, "pip", "sync", "--quiet", "--python", python, "--require-hashes",
                    "--index-strategy", "unsafe-best-match", *pip_sources(), str(TARGETS["local"].file)],
                   check=True, env={**os.environ, "UV_NO_CONFIG": "1"})


def uv_requirement() -> str:
    """uv's pinned requirement line with its hashes, as the local lock gives it (pip installs it first)."""
    text = TARGETS["local"].file.read_text()
    match = re.search(r"^uv==.*?(?=^\S|\Z)", text, re.M | re.S)
    if match is None:
        raise SystemExit(f"{TARGETS['local'].file}: uv is not locked (dev extra)")
    return match.group(0)


def main(argv: list[str]) -> None:
    if argv[:1] == ["compile"]:
        compile_all()
    elif argv[:1] == ["sync"] and len(argv) == 2:
        sync(argv[1])
    elif argv[:1] == ["uv-requirement"]:
        sys.stdout.write(uv_requirement())
    else:
        raise SystemExit("usage: python -m infra.environment.lock compile | sync PYTHON | uv-requirement")


if __name__ == "__main__":
    main(sys.argv[1:])
