"""The `prepare` stage from a run config: data source, convert and split first (cheap checks of the user's
data), then the base model, then tokenize.

    python -m workloads.prepare --config workloads/configs/local.json

Every step is atomic and skipped when its manifest shows the same inputs and parameters. The summary
(stdout, and `<results_dir>/prepare.json` for the operator's side) counts every row lost on the way.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from documents.run_config import ConfigError, RunConfig, load_run_config
from workloads.data.convert import ConvertError, convert
from workloads.data.fetch import FetchError, fetch
from workloads.data.sample import sample
from workloads.data.split import SplitError, split
from documents.prepare_summary import ConvertLosses, DataSettings, PrepareSummary, SplitCounts, write_summary
from workloads.data.tokenize import TokenizeError, tokenize, tokenize_losses
from workloads.model.folder import ModelFolderError
from workloads.model.prepare import PrepareError, prepare_model
from workloads.model.source import SourceError

log = logging.getLogger("workloads.prepare")

ERRORS = (ConfigError, ConvertError, FetchError, SplitError, TokenizeError, ModelFolderError, PrepareError, SourceError)


def source_file(config: RunConfig) -> Path:
    """The file `convert` reads: generated, a local file (relative to the run root) or downloaded."""
    data = config.data
    if data.source.startswith("sample"):
        assert data.rows is not None
        return sample(data.rows, data.seed, config.raw_data_file, "qa" if data.source == "sample:qa" else "conversations")
    if data.source.startswith("file:"):
        return config.resolve_path(data.source[len("file:"):])
    return fetch(data.source[len("hub:"):], config.raw_data_file)


def run(config: RunConfig) -> PrepareSummary:
    data = config.data
    log.info("[1/5] data source %s", data.source)
    raw = source_file(config)
    log.info("[2/5] convert %s -> %s", raw, config.conversations_file)
    limit = None if data.source.startswith("sample") else data.rows
    keep = (data.group_by,) if data.group_by else ()
    converted = convert(raw, config.conversations_file, data.max_bad_fraction, limit, keep)
    log.info("[3/5] split ratio %s%s", data.split_ratio, f", grouped by {data.group_by}" if data.group_by else "")
    parts = split(config.conversations_file, data.split_ratio, data.shuffle, data.seed, data.group_by)
    log.info("[4/5] base model %s -> %s", config.model.source, config.base_model_dir)
    model = prepare_model(config.model.source, config.base_model_dir, revision=config.model.revision)
    log.info("[5/5] tokenize (max_length %d, overlong %s, max_lost_fraction %s)", data.max_length, data.overlong,
             data.max_lost_fraction)
    tokenized = {
        side: tokenize(source, config.base_model_dir, data.max_length, out, data.overlong, data.num_proc,
                       max_lost_fraction=data.max_lost_fraction)
        for side, source, out in (("train", config.train_jsonl, config.train_tokenized_dir),
                                  ("test", config.test_jsonl, config.test_tokenized_dir))
    }
    return PrepareSummary(
        base_model_dir=str(config.base_model_dir),
        parameters=model.parameters,
        conversations=str(config.conversations_file),
        convert=ConvertLosses(rows_read=converted.rows_read, rows_kept=converted.rows_written,
                              skipped=converted.skipped_by_reason),
        split=SplitCounts.model_validate(parts.model_dump(include=set(SplitCounts.model_fields))),
        tokenized={side: tokenize_losses(m) for side, m in tokenized.items()},
        train_tokenized_dir=str(config.train_tokenized_dir),
        test_tokenized_dir=str(config.test_tokenized_dir),
        settings=DataSettings(max_length=data.max_length, overlong=data.overlong,
                              max_lost_fraction=data.max_lost_fraction, max_bad_fraction=data.max_bad_fraction,
                              group_by=data.group_by),
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workloads.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="run config JSON")
    args = parser.parse_args(argv)
    try:
        config = load_run_config(args.config)
        summary = run(config)
        write_summary(summary, config.results_dir)
    except ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for line in summary.lines():
        log.info("%s", line)
    print(summary.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
