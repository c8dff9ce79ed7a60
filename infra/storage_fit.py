"""What a run writes on each filesystem of a nebius stack, and whether it fits.

Every path of the run config is placed on the filesystem that holds it inside the jail: the submount with the
longest mount path above it, else the jail itself (``/``). A path under ``/mnt/<dir>`` that no submount serves is
refused: it would land on the jail, not on the volume its name suggests. What lands where (upper bounds):

- base model (``<model_dir>/base``): every parameter in bf16, as prepare saves it.
- data (``data_dir``): the raw rows, conversations and splits as text (``TEXT_BYTES_PER_TOKEN`` each of three copies)
  and the tokenized splits (``TOKEN_COLUMN_BYTES`` for input_ids, attention_mask and labels, int64 as ``datasets``
  stores Python ints), every row at ``max_length`` tokens.
- checkpoints (``checkpoint_dir``): ``save_total_limit`` of them; each holds the trainable parameters in fp32 and
  AdamW's two fp32 moments (12 bytes each: a 70B full fine-tune's is ~790 GiB), as planning/memory.py counts
  the trainer's state.
- exported models (``output_dir``): the adapter (fp32) or a full fine-tune's model (fp32), and the merged bf16 copy
  the export stage writes for serving.
- the Python environment (``ENV_GIB`` on the jail, where the pipeline builds it).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict

from documents.run_config import RunConfig
from infra.config import StackConfig
from planning.memory import GIB, inputs_from_run, lora_params
from planning.model_shapes import ModelShape

JAIL = "jail"
MNT = PurePosixPath("/mnt")
BF16, FP32, ADAMW_STATE = 2, 4, 8
TOKEN_COLUMN_BYTES = 3 * 8
TEXT_BYTES_PER_TOKEN = 3 * 4
DEFAULT_ROWS = 500_000
"""Rows of a hub dataset whose run config names no ``data.rows``: Finance-Instruct-500k's, as its name says."""
ENV_GIB = 10.0
"""The Python environment in the jail: 2.4 GiB measured for this project's CPU venv (``du -sh .venv``, torch 0.75 GiB
of it), plus torch's CUDA build and its nvidia-* wheels (~6 GiB installed) and vLLM (~1-2 GiB)."""


class Need(BaseModel):
    """One thing the run writes, where it writes it and its upper bound."""

    model_config = ConfigDict(frozen=True)

    what: str
    path: str
    gib: float


class FilesystemUse(BaseModel):
    """One filesystem: its size and what lands on it."""

    model_config = ConfigDict(frozen=True)

    name: str
    mount_path: str
    size_gib: int | None
    """None for a reused filesystem whose size the stack does not state."""
    needs: tuple[Need, ...]

    @property
    def need_gib(self) -> float:
        return sum(n.gib for n in self.needs)

    @property
    def fits(self) -> bool:
        return self.size_gib is None or self.need_gib <= self.size_gib

    def line(self) -> str:
        size = "size unknown" if self.size_gib is None else f"{self.size_gib:,} GiB"
        full = "" if self.size_gib is None else f", {100 * self.need_gib / self.size_gib:.0f}% full"
        parts = "; ".join(f"{n.what} {n.gib:,.1f} GiB" for n in self.needs) or "nothing from the run"
        return f"{self.name} ({self.mount_path}, {size}): {self.need_gib:,.1f} GiB{full} ({parts})"


def _mounts(cfg: StackConfig) -> list[tuple[str, PurePosixPath, int | None]]:
    fs = cfg.filesystems
    assert fs is not None
    return [(JAIL, PurePosixPath("/"), fs.jail.size_gib),
            *((s.name, PurePosixPath(s.mount_path), s.size_gib) for s in fs.submounts)]


def filesystem_of(cfg: StackConfig, path: str) -> str:
    """The filesystem holding ``path`` (absolute, inside the jail): the deepest submount above it, else the jail."""
    p = PurePosixPath(path)
    best = max((m for m in _mounts(cfg) if p == m[1] or m[1] in p.parents), key=lambda m: len(m[1].parts))
    return best[0]


def _gib(n_bytes: float) -> float:
    return n_bytes / GIB


def run_needs(run: RunConfig, shape: ModelShape) -> list[Need]:
    """What the run writes, each with its path inside the jail and its upper bound."""
    paths = run.locate("/")
    needs = [Need(what="base model", path=str(paths.base_model_dir), gib=_gib(shape.params * BF16))]
    if run.data is not None:
        rows = run.data.rows or DEFAULT_ROWS
        per_token = TOKEN_COLUMN_BYTES + TEXT_BYTES_PER_TOKEN
        needs.append(Need(what="data", path=str(paths.data_dir), gib=_gib(rows * run.max_length * per_token)))
    if run.train is not None:
        train = run.train
        if train.method == "full":
            trainable = shape.params
        else:
            trainable = lora_params(shape, train.lora.r, inputs_from_run(run).lora_target_modules)
        one = trainable * (FP32 + ADAMW_STATE)
        needs.append(Need(what=f"checkpoints ({train.save_total_limit} kept)", path=str(paths.checkpoints_dir),
                          gib=_gib(one * train.save_total_limit)))
        needs.append(Need(what="exported models", path=str(paths.train_run_dir),
                          gib=_gib(trainable * FP32 + shape.params * BF16)))
    return needs


def storage_use(cfg: StackConfig, run: RunConfig, shape: ModelShape) -> list[FilesystemUse]:
    """Every filesystem of the stack with what the run lands on it (the environment on the jail)."""
    placed: dict[str, list[Need]] = {name: [] for name, _, _ in _mounts(cfg)}
    placed[JAIL].append(Need(what="python environment", path="/", gib=ENV_GIB))
    for need in run_needs(run, shape):
        placed[filesystem_of(cfg, need.path)].append(need)
    return [FilesystemUse(name=name, mount_path=str(mount), size_gib=size, needs=tuple(placed[name]))
            for name, mount, size in _mounts(cfg)]


def unmounted_paths(cfg: StackConfig, run: RunConfig) -> list[str]:
    """Run config paths under ``/mnt/<dir>`` that no submount serves (they would land on the jail)."""
    paths = run.locate("/")
    named = {"paths.model_dir": paths.model_dir, "paths.data_dir": paths.data_dir,
             "paths.checkpoint_dir": paths.checkpoints_dir, "paths.output_dir": paths.train_run_dir,
             "paths.results_dir": paths.results_dir}
    mounted = ", ".join(str(m) for _, m, _ in _mounts(cfg)[1:]) or "none"
    return [f"{key} {path} is under {MNT} but on no submount of the stack (submounts: {mounted}); it would land on "
            f"the jail" for key, path in named.items()
            if MNT in PurePosixPath(path).parents and filesystem_of(cfg, str(path)) == JAIL]


def storage_violations(cfg: StackConfig, run: RunConfig, shape: ModelShape) -> list[str]:
    """Unmounted paths, and every filesystem the run's writes do not fit, with the need and the size."""
    found = unmounted_paths(cfg, run)
    found += [f"filesystem {u.name} ({u.mount_path}): the run needs {u.need_gib:,.1f} GiB but it has {u.size_gib:,} GiB "
              f"({'; '.join(f'{n.what} {n.gib:,.1f} GiB' for n in u.needs)})"
              for u in storage_use(cfg, run, shape) if not u.fits]
    return found
