"""The lock (locks/): fresh against pyproject, hashed, the two targets agreeing, torch's CUDA build the stacks'."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from infra.environment.lock import (
    LOCK_META, NO_DEPS, TARGETS, LockError, Target, pins, pyproject_digest, refuse_wheel_gaps, verify_lock,
    version_disagreements, wheel_gaps,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_lock_was_compiled_from_this_pyproject() -> None:
    meta = json.loads(LOCK_META.read_text())
    assert meta["pyproject_sha256"] == pyproject_digest(), "pyproject's dependencies changed: run `make lock`"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_pyproject_requirement_is_locked_within_its_range(target: str) -> None:
    spec = TARGETS[target]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *(r for extra in spec.extras for r in project["optional-dependencies"][extra])]
    locked = pins(spec.file.read_text())
    environment = {"python_version": spec.python, "python_full_version": f"{spec.python}.0", "sys_platform": "linux",
                   "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in locked, f"{requirement.name} is not in {spec.file.name}: run `make lock`"
        assert requirement.specifier.contains(Version(locked[name]), prereleases=True), (name, locked[name], line)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_pin_carries_a_hash(target: str) -> None:
    blocks = re.split(r"\n(?=\S)", TARGETS[target].file.read_text().strip())
    unhashed = [block.split()[0] for block in blocks if "--hash=sha256:" not in block]
    assert not unhashed


def test_the_targets_agree_on_every_shared_package() -> None:
    local, jail = (pins(TARGETS[name].file.read_text()) for name in ("local", "jail"))
    assert len(local.keys() & jail.keys()) > 100
    assert version_disagreements(local, jail) == []


def test_the_disagreement_check_names_the_package() -> None:
    assert version_disagreements({"torch": "2.13.0+cpu", "peft": "0.18.0"}, {"torch": "2.13.0", "peft": "0.19.1"}) == [
        "peft: 0.18.0 != 0.19.1"]


def test_torch_is_the_cpu_build_here_and_the_stacks_cuda_build_on_the_jail() -> None:
    assert pins(TARGETS["local"].file.read_text())["torch"].endswith("+cpu")
    cudas = set()
    for stack in sorted((ROOT / "stacks").glob("Pulumi.*.yaml")):
        text = stack.read_text()
        cudas |= set(re.findall(r"cudaVersion:\s*([0-9.]+)", text))
        assert yaml.safe_load(text) is not None
    assert cudas, "no stack names a cudaVersion"
    assert {".".join(c.split(".")[:2]) for c in cudas} == {TARGETS["jail"].cuda}


def test_a_package_without_a_wheel_for_the_cluster_is_refused_naming_it_and_the_platform() -> None:
    jail: Target = TARGETS["jail"]
    pylock = {"packages": [
        {"name": "torch", "version": "2.13.0", "wheels": [{"url": "https://x/torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl"}]},
        {"name": "rouge-score", "version": "0.1.2", "sdist": {"url": "https://x/rouge_score-0.1.2.tar.gz"}},
        {"name": "fancy-ext", "version": "1.0", "sdist": {"url": "https://x/fancy_ext-1.0.tar.gz"}},
    ]}
    gaps = wheel_gaps(pylock, jail)
    assert gaps == ["fancy-ext 1.0"]
    with pytest.raises(LockError, match=r"no wheel for Python 3\.12 manylinux_2_28_x86_64: fancy-ext 1\.0"):
        refuse_wheel_gaps(gaps, jail)


def test_the_plan_names_the_lock_the_source_and_the_folder_of_a_cloud_stack() -> None:
    import hashlib

    from infra.commands.plan_sections import environment_text
    from infra.config import load_stack_config
    from infra.environment.plan import environment_plan, environment_section

    demo = load_stack_config("demo", ROOT / "stacks")
    plan = environment_plan(demo)
    lock = hashlib.sha256((ROOT / "locks" / "requirements-jail.txt").read_bytes()).hexdigest()[:16]
    assert plan is not None and plan.lock_hash == lock and plan.source == "index"
    assert plan.python == f"/home/shared/finetune_env/{lock}-cp312-manylinux_2_28_x86_64/bin/python"
    section = environment_section(plan)
    assert section.size_bytes is None and section.build_seconds is None
    torch_wheel = 500_000_000
    assert section.wheels_bytes > torch_wheel
    text = environment_text(section, plan)
    assert f"lock {lock}" in text and "source index" in text and plan.folder in text
    assert environment_plan(load_stack_config("local", ROOT / "stacks")) is None


def _damage(locks: Path, case: str) -> None:
    requirements, pylock = locks / "requirements-jail.txt", locks / "pylock.jail.toml"
    text = requirements.read_text()
    if case == "pylock not TOML":
        pylock.write_text(pylock.read_text() + "[[packages]\nname = \n")
    elif case == "requirements deleted":
        requirements.unlink()
    elif case == "hash removed":
        requirements.write_text(re.sub(r"(safetensors==\S+) \\\n(    --hash=\S+(?: \\\n)?)+", r"\1\n", text))
    elif case == "bad hash":
        digest = re.search(r"safetensors==\S+ \\\n    --hash=sha256:([0-9a-f]{64})", text).group(1)
        requirements.write_text(text.replace(digest, digest[::-1]))
    elif case == "version that does not exist":
        requirements.write_text(re.sub(r"^safetensors==\S+", "safetensors==99.0.0", text, flags=re.M))
    elif case == "stale against pyproject":
        meta = json.loads((locks / "lock.json").read_text())
        meta["pyproject_sha256"] = "0" * 64
        (locks / "lock.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(("case", "named"), [
    ("pylock not TOML", r"pylock\.jail\.toml: not TOML \(.*line \d+"),
    ("requirements deleted", r"requirements-jail\.txt: missing"),
    ("hash removed", r"requirements-jail\.txt: no hash for safetensors==[\d.]+;.*requirements-jail\.txt: differs "
                     r"from the digest lock\.json records"),
    ("bad hash", r"requirements-jail\.txt: differs from the digest lock\.json records \(edited or damaged\)"),
    ("version that does not exist", r"requirements-jail\.txt: differs from the digest"),
    ("stale against pyproject", r"lock\.json: stale, compiled from other dependencies than pyproject\.toml's"),
])
def test_plan_names_the_stale_or_damaged_lock_file_in_one_line(
        case: str, named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from infra.commands.cli import main
    from infra.environment import lock

    locks = tmp_path / "locks"
    shutil.copytree(lock.LOCK_DIR, locks)
    monkeypatch.setattr(lock, "LOCK_DIR", locks)
    verify_lock(TARGETS["jail"])
    _damage(locks, case)
    assert main(["plan", "--stack", "demo"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("ftstack plan: the jail lock cannot be used: "), err
    assert re.search(named, err) and "run `make lock`" in err, err


def test_every_target_carries_the_no_dependency_packages_with_their_wheel() -> None:
    for target in TARGETS.values():
        locked = pins(target.file.read_text())
        packages = {p["name"]: p for p in tomllib.loads(target.pylock.read_text())["packages"]}
        for name, version in NO_DEPS.items():
            assert locked[name] == version and packages[name]["version"] == version and packages[name]["wheels"]
