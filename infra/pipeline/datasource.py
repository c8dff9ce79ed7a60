"""Content fingerprint of a run config's `file:` data source, read where the jobs will read it.

The stage fingerprints cover the run config's sections; a `file:` source replaced under the same path
changes none of them. This reads the file's size and modification time through the transport (this
machine, or the login node over SSH) and its sha256 when those changed since the recorded fingerprint,
so replacing the file resubmits prepare and everything after it, and an unchanged file costs one `stat`.
"""

from __future__ import annotations

from pathlib import Path

from documents.pipeline_state import SourceFingerprint
from documents.run_config import RunConfig
from infra.pipeline.transport import Transport


class DataSourceError(ValueError):
    """The data source cannot be read where the jobs run; the message names the source and the path."""


def source_path(run: RunConfig, run_root: str | Path) -> str | None:
    """Where the jobs read a `file:` source (relative paths resolve against the run root); None otherwise."""
    if not run.data.source.startswith("file:"):
        return None
    path = Path(run.data.source[len("file:"):]).expanduser()
    return str(path if path.is_absolute() else Path(run_root) / path)


def fingerprint_source(channel: Transport, run: RunConfig, run_root: str | Path,
                       recorded: SourceFingerprint | None = None) -> SourceFingerprint | None:
    """The source's fingerprint; the recorded sha256 is reused while path, size and mtime are unchanged."""
    path = source_path(run, run_root)
    if path is None:
        return None
    stat = channel.run(["stat", "-L", "-c", "%s %.9Y", path], timeout=60)
    if not stat.ok:
        raise DataSourceError(f"data source {run.data.source}: cannot read {path} where the jobs run "
                              f"({(stat.stderr or stat.stdout).strip()})")
    size, mtime = stat.stdout.split()
    if recorded is not None and (recorded.source, recorded.path, recorded.size, recorded.mtime) == (
            run.data.source, path, int(size), mtime):
        return recorded
    digest = channel.run(["sha256sum", path], timeout=3600)
    if not digest.ok:
        raise DataSourceError(f"data source {run.data.source}: cannot hash {path} ({digest.stderr.strip()})")
    return SourceFingerprint(source=run.data.source, path=path, size=int(size), mtime=mtime,
                             sha256=digest.stdout.split()[0])
