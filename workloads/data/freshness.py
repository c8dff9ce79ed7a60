"""Whether a data stage's output is current: its manifest records the same stage, parameters and input hashes."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from documents.atomic import sha256_file, utc_now
from documents.stage_manifest import FileDigest, StageManifest, load_stage_manifest, manifest_path


def build_manifest(stage: str, inputs: Mapping[str, str | os.PathLike[str]], params: Mapping[str, Any],
                   **figures: Any) -> StageManifest:
    """Record of a stage's run: its parameters, the sha256 of each input file and the stage's own figures."""
    return StageManifest(
        stage=stage,
        inputs={key: FileDigest(path=str(Path(p).resolve()), sha256=sha256_file(p)) for key, p in inputs.items()},
        params=dict(params), created=utc_now(), **figures,
    )


def is_current(output: str | os.PathLike[str], stage: str, inputs: Mapping[str, str | os.PathLike[str]],
               params: Mapping[str, Any]) -> bool:
    """True when `output` exists and its manifest records the same stage, parameters and input hashes."""
    output = Path(output)
    if not output.exists():
        return False
    manifest = load_stage_manifest(manifest_path(output))
    if manifest is None or manifest.stage != stage or manifest.params != json.loads(json.dumps(params)):
        return False
    if set(manifest.inputs) != set(inputs):
        return False
    return all(Path(p).is_file() and manifest.inputs[key].sha256 == sha256_file(p) for key, p in inputs.items())
