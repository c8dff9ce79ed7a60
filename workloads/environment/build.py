"""Build the workloads' environment on a cluster node from a shipped lock (the `environment` stage).

    python -m workloads.environment.build --source DIR [--source DIR ...] --root DIR

Each --source is built in turn (the workloads' environment, then on a stack that serves on GPUs vLLM's serving
environment from the serving lock), each into its own folder under the same root. Run by the cluster's bare Python (standard library only). DIR of --source holds what the operator's machine
shipped (infra.environment.source): `source.json` (key, source kind, target Python and platform),
`requirements.txt` (the lock, hashes), and for the wheelhouse source `wheels/` (every locked wheel and uv's).
The environment is `<root>/<key>`: built under `<root>/.<key>.tmp-<pid>` and renamed when complete, with its
manifest (documents.environment_manifest) written last inside it, so a killed build leaves nothing a job would
use. One build per key at a time (an exclusive lock on `<root>/.<key>.lock`); a finished key is skipped.
A failure prints one line on stderr and leaves every other environment as it was.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from datetime import datetime, timezone
from pathlib import Path

MANIFEST = "environment.json"
LOCK_COPY = "requirements.txt"
INSTALL_TIMEOUT_S = 3600
INSTALLED_VERSIONS = """
import importlib.metadata, json, re
found = {}
for distribution in importlib.metadata.distributions():
    if distribution.metadata["Name"]:
        found.setdefault(re.sub(r"[-_.]+", "-", distribution.metadata["Name"]).lower(), distribution.version)
"""
"""Code for another interpreter: `found`, each distribution's version as import finds it (first on sys.path)."""
INSTALLED_CODE = INSTALLED_VERSIONS + "print(json.dumps(found))\n"
"""Run by the new environment's interpreter: INSTALLED_VERSIONS printed as JSON."""


class BuildFailed(RuntimeError):
    """The build cannot finish; the message is the one line the stage prints."""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith(("error", "×", "oserror"))]
    return (errors or lines or ["(no output)"])[-1][:400]


def _run(command: list[str], what: str) -> None:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildFailed(f"{what}: {error}") from None
    if proc.returncode != 0:
        raise BuildFailed(f"{what} failed (exit {proc.returncode}): {_last_line(proc.stderr + proc.stdout)}")


def _uv_from_wheelhouse(wheels: Path, dest: Path) -> Path | None:
    """The uv binary out of the wheelhouse's uv wheel (the wheel's `*.data/scripts/uv`), None without one."""
    for wheel in sorted(wheels.glob("uv-*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            member = next((n for n in archive.namelist() if re.fullmatch(r"uv-[^/]+\.data/scripts/uv", n)), None)
            if member is None:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(archive.read(member))
            dest.chmod(0o755)
            return dest
    return None


def check_interpreter(spec: dict) -> None:
    """The running Python is the one the lock was resolved for."""
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running != spec["python"]:
        raise BuildFailed(f"the lock {spec['lock_hash']} is for Python {spec['python']}, this node's interpreter "
                          f"{sys.executable} is {running}")


def install(spec: dict, source: Path, tmp: Path) -> str:
    """A venv at tmp with every locked package; returns the installer used."""
    kind = spec["source"]
    wheels = source / "wheels"
    shipped_uv = kind == "wheelhouse" and any(wheels.glob("uv-*.whl"))
    venv = [sys.executable, "-m", "venv", *(["--system-site-packages"] if kind == "container" else []),
            *(["--without-pip"] if shipped_uv else []), str(tmp)]
    _run(venv, f"python -m venv {tmp}")
    uv = _uv_from_wheelhouse(wheels, tmp / "bin" / "uv") if shipped_uv else None
    python = str(tmp / "bin" / "python")
    requirements = str(source / LOCK_COPY)
    offline = ["--no-index", "--find-links", str(wheels)] if kind == "wheelhouse" else []
    if uv is not None:
        _run([str(tmp / "bin" / "uv"), "pip", "install", "--quiet", "--python", python, "--no-deps",
              "--require-hashes", "--offline", "--no-cache", *offline, "-r", requirements],
             f"uv pip install from the {kind}")
        return "uv"
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--require-hashes", "--no-cache-dir",
          "--disable-pip-version-check", *offline, "-r", requirements], f"pip install from the {kind}")
    return "pip"


def installed_packages(python: Path) -> dict[str, str]:
    """The venv's distributions (normalized name -> version), as its own interpreter imports them: the first copy on
    its sys.path, so the venv's own over an image's shadowed one (`--system-site-packages`)."""
    proc = subprocess.run([str(python), "-c", INSTALLED_CODE], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise BuildFailed(f"the new environment's interpreter does not start: {_last_line(proc.stderr)}")
    return json.loads(proc.stdout)


def folder_size(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_symlink())


def build(source: Path, root: Path) -> Path:
    """The environment folder for the shipped lock: built now, or the one already there."""
    spec = json.loads((source / "source.json").read_text())
    key = spec["key"]
    final = root / key
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{key}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if (final / MANIFEST).is_file():
            print(f"environment: {final} already built; nothing to do")
            return final
        check_interpreter(spec)
        for stale in root.glob(f".{key}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".{key}.tmp-{os.getpid()}"
        started = time.monotonic()
        try:
            installer = install(spec, source, tmp)
            shutil.copyfile(source / LOCK_COPY, tmp / LOCK_COPY)
            manifest = {
                "key": key, "lock_hash": spec["lock_hash"], "source": spec["source"], "image": spec.get("image"),
                "python": platform.python_version(), "platform": spec["platform"], "installer": installer,
                "packages": installed_packages(tmp / "bin" / "python"), "size_bytes": folder_size(tmp),
                "build_seconds": round(time.monotonic() - started, 1),
                "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "job_id": os.environ.get("SLURM_JOB_ID"), "node": socket.gethostname(),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            os.rename(tmp, final)
        except OSError as error:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BuildFailed(f"writing {tmp}: {error.strerror or error}") from None
        except BuildFailed:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        print(f"environment: built {final} with {installer} in {manifest['build_seconds']}s "
              f"({manifest['size_bytes'] / 2**20:.0f} MiB, {len(manifest['packages'])} packages)")
        return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, required=True, action="append",
                        help="the shipped lock (and wheelhouse); repeated, one environment each")
    parser.add_argument("--root", type=Path, required=True, help="folder of the environments, in the shared jail")
    args = parser.parse_args(argv)
    try:
        for source in args.source:
            build(source, args.root)
    except BuildFailed as error:
        print(f"environment: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
