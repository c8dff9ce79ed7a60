"""What the operator's machine ships for the `environment` stage: the lock, and for the wheelhouse source the wheels.

A source folder (`source.json`, `requirements.txt`, `wheels/`) is staged here and uploaded to
`<env root>/sources/<key>` on the cluster (infra.pipeline.environment_source); the stage builds `<env root>/<key>` from it
(workloads.environment.build). The wheelhouse is downloaded once per key into `.local/wheelhouse/<key>` with pip
(hashes checked, wheels only, for the cluster's Python and platform whatever this machine's are) and reused while the
lock stays the same.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from infra.environment.lock import (
    PURE_SDISTS, TARGETS, WHEEL_PLATFORM, LockError, Target, lock_hash, normalize, refuse_wheel_gaps,
)
from infra.environment.serving_lock import ServeTarget

SOURCE_SPEC = "source.json"
INSTALL_FILE = "requirements.txt"
WHEELS = "wheels"


def environment_key(target: Target | ServeTarget) -> str:
    """`<lock hash>-cp<XY>-<platform>`: the environment's folder name on the cluster."""
    return f"{lock_hash(target.file)}-cp{target.python.replace('.', '')}-{WHEEL_PLATFORM[target.platform]}"


def _blocks(text: str) -> dict[str, str]:
    """{normalized name: its requirement block (pin line and hash lines)} of a hashed requirements file."""
    blocks = {}
    for block in re.split(r"\n(?=\S)", text.strip()):
        name = block.split("==", 1)[0].strip()
        if name and not name.startswith("#"):
            blocks[normalize(name)] = block.rstrip() + "\n"
    return blocks


def _chosen_files(pylock: Path) -> dict[str, dict]:
    """{normalized name: the file uv chose for the target (its first wheel; the sdist when it has none)} with
    'version', 'url', 'sha256' and 'wheel'."""
    files = {}
    for package in tomllib.loads(pylock.read_text())["packages"]:
        chosen = (package.get("wheels") or [package.get("sdist")])[0]
        files[normalize(package["name"])] = {"version": package["version"], "url": chosen["url"],
                                             "sha256": chosen["hashes"]["sha256"], "wheel": bool(package.get("wheels"))}
    return files


def manylinux_platforms(platform: str) -> list[str]:
    """pip's --platform values for a manylinux target: pip 23 takes `manylinux_2_28_x86_64` literally, so the older
    glibc tags a wheel may carry are listed as packaging's `_manylinux.platform_tags` yields them (2_Y down to 2_5,
    with the PEP 600 legacy aliases manylinux2014 = 2_17, manylinux2010 = 2_12, manylinux1 = 2_5)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if match is None:
        raise LockError(f"not a manylinux platform: {platform}")
    newest, arch = int(match.group(1)), match.group(2)
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return [tag for minor in range(newest, 4, -1)
            for tag in (f"manylinux_2_{minor}_{arch}", *([f"{legacy[minor]}_{arch}"] if minor in legacy else []))]


def target_flags(target: Target | ServeTarget) -> list[str]:
    """pip download's flags for wheels of the target's Python and platform, whatever this machine's are."""
    return [*(arg for tag in manylinux_platforms(WHEEL_PLATFORM[target.platform]) for arg in ("--platform", tag)),
            "--python-version", target.python, "--implementation", "cp", "--only-binary=:all:"]


def _pip_download(files: dict[str, dict], dest: Path, tmp: Path, flags: list[str]) -> None:
    """Fetch each chosen file by its URL, hash checked (pip: this machine's certificates and proxies); `flags` name
    the Python and platform wheels are for (none for source archives)."""
    requirements = tmp / "download.txt"
    requirements.write_text("".join(f"{name} @ {f['url']} --hash=sha256:{f['sha256']}\n" for name, f in files.items()))
    _pip_download_file(requirements, dest, flags)


def _pip_download_file(requirements: Path, dest: Path, flags: list[str]) -> None:
    """pip download of a hashed requirements file, without dependencies; LockError with pip's last line."""
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                           "--no-build-isolation", "--disable-pip-version-check", *flags, "-d", str(dest), "-r",
                           str(requirements)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise LockError(f"downloading the locked files failed: {tail[0]}")


def _build_pure_wheels(target: Target, sdists: dict[str, dict], tmp: Path, wheels: Path) -> dict[str, str]:
    """Wheels of the pure-Python sdists (PURE_SDISTS) in the lock, built here from their hashed sdists; each must
    come out `py3-none-any`. Returns their install lines (the built wheel's hash)."""
    built = {}
    for name, chosen in sorted(sdists.items()):
        folder = tmp / f"sdist-{name}"
        _pip_download({name: chosen}, folder, tmp, [])
        [sdist] = list(folder.iterdir())
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels),
                               str(sdist)], capture_output=True, text=True)
        made = sorted(wheels.glob(f"{name.replace('-', '_')}-*.whl"))
        if proc.returncode != 0 or not made or not made[-1].name.endswith("-py3-none-any.whl"):
            raise LockError(f"no wheel for Python {target.python} {WHEEL_PLATFORM[target.platform]}: {name} "
                            "(its sdist did not build to a pure-Python wheel)")
        digest = hashlib.sha256(made[-1].read_bytes()).hexdigest()
        built[name] = f"{name}=={chosen['version']} \\\n    --hash=sha256:{digest}\n"
    return built


def _publish(stage: Path, folder: Path) -> None:
    """Rename the finished `stage` to `folder`; where another process (two runs at once) published the same key
    first, its complete wheelhouse is kept and this one goes with the temporary folder."""
    try:
        stage.rename(folder)
    except OSError:
        if not (folder / INSTALL_FILE).is_file():
            raise


def wheelhouse(target: Target, cache_root: Path) -> Path:
    """`cache_root/<key>`: the wheel uv chose for the target of every locked package (uv's included) and the
    install file naming them with their hashes; downloaded once, reused while the lock is unchanged. A package
    with no wheel for the target is refused, naming it and the platform."""
    folder = cache_root / environment_key(target)
    if (folder / INSTALL_FILE).is_file():
        return folder
    files = _chosen_files(target.pylock)
    refuse_wheel_gaps([f"{name} {f['version']}" for name, f in files.items()
                       if not f["wheel"] and name not in PURE_SDISTS], target)
    installer = {} if "uv" in files else {"uv": _chosen_files(TARGETS["local"].pylock)["uv"]}
    cache_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wheelhouse-", dir=cache_root) as tmp_name:
        tmp = Path(tmp_name)
        stage, wheels = tmp / "stage", tmp / "stage" / WHEELS
        wheels.mkdir(parents=True)
        wanted = {**{n: f for n, f in files.items() if f["wheel"]}, **installer}
        _pip_download(wanted, wheels, tmp, target_flags(target))
        built = _build_pure_wheels(target, {n: f for n, f in files.items() if not f["wheel"]}, tmp, wheels)
        blocks = _blocks(target.file.read_text())
        (stage / INSTALL_FILE).write_text("".join(built.get(name, block) for name, block in blocks.items()))
        _publish(stage, folder)
    return folder


def serving_wheelhouse(target: ServeTarget, cache_root: Path) -> Path:
    """`cache_root/<key>` for a serving lock target: each pinned package's wheel for the target's Python and
    platform, picked by pip from the index by the requirements file's hashes (the serving lock has no PEP 751 file
    naming URLs); its install file is the lock itself. Downloaded once, reused while the lock is unchanged."""
    folder = cache_root / environment_key(target)
    if (folder / INSTALL_FILE).is_file():
        return folder
    cache_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wheelhouse-", dir=cache_root) as tmp_name:
        stage = Path(tmp_name) / "stage"
        (stage / WHEELS).mkdir(parents=True)
        _pip_download_file(target.file, stage / WHEELS, target_flags(target))
        shutil.copyfile(target.file, stage / INSTALL_FILE)
        _publish(stage, folder)
    return folder


def stage_source(target: Target | ServeTarget, kind: str, dest: Path, *, cache_root: Path,
                 image: str | None = None) -> str:
    """Fill dest with what the cluster needs to build the environment; returns the key."""
    key = environment_key(target)
    dest.mkdir(parents=True, exist_ok=True)
    if kind == "wheelhouse":
        house = wheelhouse(target, cache_root) if isinstance(target, Target) else serving_wheelhouse(target, cache_root)
        shutil.copyfile(house / INSTALL_FILE, dest / INSTALL_FILE)
        (dest / WHEELS).mkdir()
        for wheel in (house / WHEELS).iterdir():
            try:
                (dest / WHEELS / wheel.name).hardlink_to(wheel)
            except OSError:
                shutil.copyfile(wheel, dest / WHEELS / wheel.name)
    else:
        shutil.copyfile(target.file, dest / INSTALL_FILE)
    spec = {"key": key, "lock_hash": lock_hash(target.file), "source": kind, "python": target.python,
            "platform": WHEEL_PLATFORM[target.platform], "image": image}
    (dest / SOURCE_SPEC).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    return key


