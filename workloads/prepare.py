"""The `prepare` stage from a run config: base model, then data (sample or fetch, convert, split, tokenize).

    python -m workloads.prepare --config workloads/configs/local.json

Every step is atomic and skipped when its manifest shows the same inputs and parameters.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from workloads.config import ConfigError, RunConfig, load_run_config
from workloads.data.convert import ConvertError, convert
from workloads.data.fetch import FetchError, fetch
from workloads.data.sample import sample
from workloads.data.split import SplitError, split
from workloads.data.tokenize import TokenizeError, tokenize
from workloads.model.folder import ModelFolderError
from workloads.model.prepare import PrepareError, prepare_model
from workloads.model.source import SourceError

log = logging.getLogger("workloads.prepare")

ERRORS = (ConfigError, ConvertError, FetchError, SplitError, TokenizeError, ModelFolderError, PrepareError, SourceError)


def source_file(config: RunConfig) -> Path:
    """The file `convert` reads: generated, a local file (relative to the run root) or downloaded."""
    data = config.data
    if data.source == "sample":
        assert data.rows is not None
        return sample(data.rows, data.seed, config.raw_data_file)
    if data.source.startswith("file:"):
        return config.resolve_path(data.source[len("file:"):])
    return fetch(data.source[len("hub:"):], config.raw_data_file)


def run(config: RunConfig) -> dict[str, Any]:
    data = config.data
    log.info("[1/5] base model %s -> %s", config.model.source, config.base_model_dir)
    model = prepare_model(config.model.source, config.base_model_dir, revision=config.model.revision)
    log.info("[2/5] data source %s", data.source)
    raw = source_file(config)
    log.info("[3/5] convert %s -> %s", raw, config.conversations_file)
    limit = None if data.source == "sample" else data.rows
    converted = convert(raw, config.conversations_file, data.max_bad_fraction, limit)
    log.info("[4/5] split ratio %s", data.split_ratio)
    parts = split(config.conversations_file, data.split_ratio, data.shuffle, data.seed)
    log.info("[5/5] tokenize (max_length %d, %s)", data.max_length, data.overlong)
    tokenized = {
        side: tokenize(source, config.base_model_dir, data.max_length, out, data.overlong, data.num_proc)
        for side, source, out in (("train", config.train_jsonl, config.train_tokenized_dir),
                                  ("test", config.test_jsonl, config.test_tokenized_dir))
    }
    return {
        "base_model_dir": str(config.base_model_dir),
        "parameters": model.get("parameters"),
        "conversations": str(config.conversations_file),
        "rows_converted": converted["rows_written"],
        "rows_skipped": converted["rows_skipped"],
        "train_rows": parts["train_rows"],
        "test_rows": parts["test_rows"],
        "duplicate_rows": parts["duplicate_rows"],
        "train_tokenized_dir": str(config.train_tokenized_dir),
        "test_tokenized_dir": str(config.test_tokenized_dir),
        "tokenized": {side: {k: m[k] for k in ("rows_written", "truncated", "dropped_overlong", "mean_tokens")}
                      for side, m in tokenized.items()},
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workloads.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="run config JSON")
    args = parser.parse_args(argv)
    try:
        summary = run(load_run_config(args.config))
    except ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
