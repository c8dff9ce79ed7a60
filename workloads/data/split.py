"""Split a chat JSONL file into FILE_train.jsonl and FILE_test.jsonl beside it.

    python -m workloads.data.split --input conversations.jsonl --ratio 0.9 [--shuffle --seed 0] [--group-by COLUMN]

Exact duplicates always land on the same side, and with --group-by so do all rows sharing a value of
COLUMN (e.g. the document several questions are about); the report (FILE_split.report.json) counts
rows, groups and duplicates on each side.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from documents.atomic import atomic_file, os_errors_as, sha256_file
from documents.base import DocumentError
from documents.chat_row import ChatRow, ChatRowError, read_chat_rows
from documents.data_reports import SplitReport, read_split_report, split_report_path, write_report
from documents.stage_manifest import manifest_path, write_manifest
from workloads.data.freshness import build_manifest, is_current

log = logging.getLogger("workloads.data.split")


class SplitError(ValueError):
    """The input cannot be split; the message names the file and line."""


def split_paths(input_path: Path) -> tuple[Path, Path]:
    return (input_path.with_name(f"{input_path.stem}_train.jsonl"), input_path.with_name(f"{input_path.stem}_test.jsonl"))


def read_rows(path: Path, group_by: str | None = None) -> list[tuple[str, ChatRow]]:
    """Each non-blank line with its chat row (and a `group_by` value, checked)."""
    rows = []
    try:
        for number, line, row in read_chat_rows(path):
            if group_by is not None and row.kept(group_by) is None:
                raise SplitError(f"{path}:{number}: no {group_by!r} value to group by (convert with --keep {group_by})")
            rows.append((line, row))
    except ChatRowError as error:
        raise SplitError(str(error)) from None
    if not rows:
        raise SplitError(f"{path}: no rows")
    return rows


def _groups(rows: list[tuple[str, ChatRow]], group_by: str | None) -> tuple[list[list[str]], dict[str, int]]:
    """Rows that must stay together: identical rows, and rows sharing a `group_by` value (joined when an
    identical row links two values). Groups keep the order of their first row."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key] = parent[parent[key]]
        return key

    contents = []
    for _, row in rows:
        content = "c" + json.dumps(row.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
        contents.append(content)
        if group_by is not None:
            parent[root(content)] = root("g" + str(row.kept(group_by)))
        root(content)
    same: dict[str, list[str]] = {}
    for content in contents:
        same.setdefault(content, []).append(content)
    groups: dict[str, list[str]] = {}
    for (line, _), content in zip(rows, contents):
        groups.setdefault(root(content), []).append(line)
    duplicates = {"duplicate_groups": sum(1 for g in same.values() if len(g) > 1),
                  "duplicate_rows": sum(len(g) - 1 for g in same.values())}
    return list(groups.values()), duplicates


def assign(rows: list[tuple[str, ChatRow]], ratio: float, shuffle: bool, seed: int, group_by: str | None = None
           ) -> tuple[list[str], list[str], dict[str, Any]]:
    """Train and test rows. Groups (identical rows; rows sharing a `group_by` value), not rows, are cut at
    `ratio`: a group lands whole on one side."""
    groups, counts = _groups(rows, group_by)
    if shuffle:
        random.Random(seed).shuffle(groups)
    target = round(len(rows) * ratio)
    train: list[str] = []
    test: list[str] = []
    sides = {"train": 0, "test": 0}
    for group in groups:
        side = "train" if len(train) < target else "test"
        (train if side == "train" else test).extend(group)
        sides[side] += 1
    counts.update({"groups": len(groups), "train_groups": sides["train"], "test_groups": sides["test"],
                   "group_by": group_by})
    return train, test, counts


def split(input_path: str | Path, ratio: float, shuffle: bool = False, seed: int = 0,
          group_by: str | None = None) -> SplitReport:
    """Write the two splits (atomic, with manifests) and return the report. No-op if current."""
    input_path = Path(input_path)
    with os_errors_as(SplitError, input_path.with_name(f"{input_path.stem}_{{train,test}}.jsonl")):
        return _split(input_path, ratio, shuffle, seed, group_by)


def _split(input_path: Path, ratio: float, shuffle: bool, seed: int, group_by: str | None) -> SplitReport:
    if not 0.0 < ratio < 1.0:
        raise SplitError(f"ratio must be between 0 and 1 (exclusive), got {ratio}")
    train_path, test_path = split_paths(input_path)
    report_file = split_report_path(input_path)
    params = {"ratio": ratio, "shuffle": shuffle, "seed": seed if shuffle else None,
              **({"group_by": group_by} if group_by else {})}
    inputs = {"input": input_path}
    if input_path.is_file() and all(is_current(p, "split", inputs, {**params, "side": side})
                                    for p, side in ((train_path, "train"), (test_path, "test"))):
        try:
            stored = read_split_report(report_file)
        except DocumentError as error:
            log.warning("%s; splitting again", error)
        else:
            log.info("%s and %s are up to date", train_path, test_path)
            return stored
    rows = read_rows(input_path, group_by)
    train, test, duplicates = assign(rows, ratio, shuffle, seed, group_by)
    if not train or not test:
        raise SplitError(f"{input_path}: {len(rows)} rows at ratio {ratio} leave the "
                         f"{'train' if not train else 'test'} split empty")
    with ExitStack() as stack:
        for path, lines in ((train_path, train), (test_path, test)):
            tmp = stack.enter_context(atomic_file(path))
            with os_errors_as(SplitError, path):
                tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    for path, side, lines in ((train_path, "train", train), (test_path, "test", test)):
        write_manifest(manifest_path(path), build_manifest("split", inputs, {**params, "side": side},
                                                           output_sha256=sha256_file(path), rows=len(lines)))
    report = SplitReport(input=str(input_path.resolve()), train=str(train_path.resolve()),
                         test=str(test_path.resolve()), rows=len(rows), train_rows=len(train), test_rows=len(test),
                         **(duplicates | params))
    write_report(report_file, report)
    log.info("split %d rows in %d groups: %d rows (%d groups) train, %d rows (%d groups) test "
             "(%d duplicate rows kept together)", len(rows), duplicates["groups"], len(train),
             duplicates["train_groups"], len(test), duplicates["test_groups"], duplicates["duplicate_rows"])
    return report


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workloads.data.split", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="chat .jsonl file")
    parser.add_argument("--ratio", type=float, required=True, help="fraction of rows in the train split, e.g. 0.9")
    parser.add_argument("--shuffle", action="store_true", help="shuffle before splitting")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed")
    parser.add_argument("--group-by", metavar="COLUMN", help="keep rows with the same value of this field on one side")
    args = parser.parse_args(argv)
    try:
        report = split(args.input, args.ratio, args.shuffle, args.seed, args.group_by)
    except SplitError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(report.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
