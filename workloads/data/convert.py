"""Convert system/user/assistant rows (.parquet, .json, .jsonl) to chat JSONL, one {"messages": [...]} per line.

    python -m workloads.data.convert --input raw.parquet --output conversations.jsonl [--max-bad-fraction 0.01]

Rows with a missing, empty or non-string user or assistant field, or text that is not Unicode (a lone surrogate
such as `\\ud800`, which JSON's escapes allow), are skipped and counted by reason in
FILE.report.json; above the bad fraction the stage fails and writes no output.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from documents.atomic import atomic_file, os_errors_as, sha256_file
from documents.base import DocumentError
from documents.chat_row import ChatRow, chat_row_line
from documents.data_reports import BadRow, ConvertReport, convert_report_path, read_convert_report, write_report
from documents.stage_manifest import manifest_path, write_manifest
from documents.text_input import JsonTooDeep, TextInputError, is_unicode, load_json
from workloads.data.freshness import build_manifest, is_current

log = logging.getLogger("workloads.data.convert")

REQUIRED = ("user", "assistant")
FIRST_BAD = 10
PARQUET_MAGIC = b"PAR1"
UNREADABLE = {"not_utf8": "not UTF-8 text", "invalid_json": "not valid JSON",
              "json_nested_too_deeply": "JSON nested too deeply"}
"""parse problems of a JSON line, by reason."""


class ConvertError(ValueError):
    """The input cannot be converted; the message names the file (and rows where it applies)."""


Item = tuple[int, Any, str | None]


def _parquet_rows(path: Path, keep: tuple[str, ...] = ()) -> Iterator[Item]:
    try:
        handle = pq.ParquetFile(path)
        names = set(handle.schema_arrow.names)
        missing = [c for c in (*REQUIRED, *keep) if c not in names]
        if missing:
            raise ConvertError(f"{path}: missing column(s) {', '.join(missing)}; found {sorted(names)}")
        columns = [c for c in ("system", *REQUIRED, *keep) if c in names]
        number = 0
        for batch in handle.iter_batches(columns=columns, batch_size=4096):
            for row in batch.to_pylist():
                number += 1
                yield number, row, None
    except (pa.ArrowException, OSError) as error:
        raise ConvertError(f"{path}: unreadable parquet file: {error}") from None


def _jsonl_rows(path: Path) -> Iterator[Item]:
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield number, None, "not_utf8"
                continue
            try:
                row = load_json(text, f"{path}:{number}")
            except JsonTooDeep:
                yield number, None, "json_nested_too_deeply"
            except TextInputError:
                yield number, None, "invalid_json"
            else:
                yield number, row, None


def _json_rows(path: Path) -> Iterator[Item]:
    try:
        data = load_json(path.read_bytes(), str(path))
    except TextInputError as error:
        raise ConvertError(str(error)) from None
    if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()) and data:
        length = len(next(iter(data.values())))
        data = [{key: values[i] if i < len(values) else None for key, values in data.items()} for i in range(length)]
    if not isinstance(data, list):
        raise ConvertError(f"{path}: expected a JSON array of objects (or an object of columns)")
    for number, row in enumerate(data, start=1):
        yield number, row, None


def _json_array_in_lines(path: Path) -> bool:
    """A .jsonl file that is one JSON array (on one line, or spread over many) rather than one object per line."""
    with open(path, "rb") as handle:
        first = next((line for line in handle if line.strip()), b"")
        more = next((line for line in handle if line.strip()), None) is not None
    if not first.lstrip().startswith(b"["):
        return False
    try:
        return isinstance(load_json(first, str(path)), list) and not more
    except JsonTooDeep:
        return False
    except TextInputError:
        return True


def _mislabelled(path: Path, suffix: str) -> str | None:
    """What the file really is when its content contradicts its name, else None."""
    with open(path, "rb") as handle:
        head = handle.read(64).lstrip()
    is_parquet = head.startswith(PARQUET_MAGIC)
    if suffix == ".parquet" and not is_parquet and head[:1] in (b"{", b"["):
        return "holds JSON text, not a Parquet file; rename it to .json (one array) or .jsonl (one object per line)"
    if suffix in (".json", ".jsonl") and is_parquet:
        return "is a Parquet file, not JSON; rename it to .parquet"
    if suffix == ".jsonl" and _json_array_in_lines(path):
        return "is one JSON array, not JSON lines (one object per line); rename it to .json"
    return None


def read_rows(path: Path, keep: tuple[str, ...] = ()) -> Iterator[Item]:
    """(row number, row, parse problem) for each row of a .parquet, .json or .jsonl file."""
    if not path.is_file():
        raise ConvertError(f"{path}: file not found")
    if path.stat().st_size == 0:
        raise ConvertError(f"{path}: file is empty")
    suffix = path.suffix.lower()
    if problem := _mislabelled(path, suffix):
        raise ConvertError(f"{path}: {problem}")
    if suffix == ".parquet":
        return _parquet_rows(path, keep)
    if suffix == ".jsonl":
        return _jsonl_rows(path)
    if suffix == ".json":
        return _json_rows(path)
    raise ConvertError(f"{path}: unsupported file type {suffix!r} (use .parquet, .json or .jsonl)")


def row_problem(row: Any, keep: tuple[str, ...] = ()) -> str | None:
    """Why a parsed row cannot become a conversation (or lacks a kept column), or None."""
    if not isinstance(row, dict):
        return "not_an_object"
    for field in keep:
        if row.get(field) is None:
            return f"{field}_missing"
    for field in REQUIRED:
        if field not in row or row[field] is None:
            return f"{field}_missing"
        if not isinstance(row[field], str):
            return f"{field}_not_string"
        if not row[field].strip():
            return f"{field}_empty"
    system = row.get("system")
    if system is not None and not isinstance(system, str):
        return "system_not_string"
    for field in ("system", *REQUIRED, *keep):
        if not is_unicode(str(row.get(field) or "")):
            return f"{field}_not_unicode"
    return None


def to_chat_row(row: dict[str, Any], keep: tuple[str, ...] = ()) -> ChatRow:
    """A checked source row (see `row_problem`) as a chat row, the `keep` columns carried as strings."""
    return ChatRow.from_columns(row.get("system"), row["user"], row["assistant"],
                                **{column: str(row[column]) for column in keep})


def convert(
    input_path: str | Path, output: str | Path, max_bad_fraction: float = 0.01, limit: int | None = None,
    keep: tuple[str, ...] = (),
) -> ConvertReport:
    """Convert `input_path` to chat JSONL at `output` (atomic); returns the report. No-op if current.
    Columns in `keep` (e.g. a document id to split by) are carried beside `messages`, as strings."""
    with os_errors_as(ConvertError, output):
        return _convert(Path(input_path), Path(output), max_bad_fraction, limit, tuple(keep))


def _check_options(output: Path, max_bad_fraction: float, keep: tuple[str, ...]) -> None:
    if not 0.0 <= max_bad_fraction <= 1.0:
        raise ConvertError(f"max_bad_fraction must be within [0, 1], got {max_bad_fraction}")
    if output.is_dir():
        raise ConvertError(f"{output}: is a folder; the output is the .jsonl file to write")
    if clash := [c for c in keep if c == "messages"]:
        raise ConvertError(f"cannot keep a column named {clash[0]!r} (the conversation's own field)")


def _convert(input_path: Path, output: Path, max_bad_fraction: float, limit: int | None,
             keep: tuple[str, ...]) -> ConvertReport:
    _check_options(output, max_bad_fraction, keep)
    params = {"max_bad_fraction": max_bad_fraction, "limit": limit, **({"keep": list(keep)} if keep else {})}
    if input_path.is_file() and is_current(output, "convert", {"input": input_path}, params):
        try:
            stored = read_convert_report(convert_report_path(output))
        except DocumentError as error:
            log.warning("%s; converting again", error)
        else:
            log.info("%s is up to date", output)
            return stored
    reasons: Counter[str] = Counter()
    first_bad: list[BadRow] = []
    seen_columns: set[str] = set()
    total = written = 0
    with atomic_file(output) as tmp:
        with open(tmp, "w", encoding="utf-8") as out:
            for number, row, problem in read_rows(input_path, keep):
                if limit is not None and total >= limit:
                    break
                total += 1
                if isinstance(row, dict):
                    seen_columns.update(row)
                problem = problem or row_problem(row, keep)
                if problem:
                    reasons[problem] += 1
                    if len(first_bad) < FIRST_BAD:
                        first_bad.append(BadRow(row=number, reason=problem))
                    continue
                out.write(chat_row_line(to_chat_row(row, keep)))
                written += 1
        if total == 0:
            raise ConvertError(f"{input_path}: no rows")
        if not seen_columns and set(reasons) <= set(UNREADABLE):
            raise ConvertError(f"{input_path}: no row could be read as JSON: "
                               + "; ".join(f"line {b.row}: {UNREADABLE[b.reason]}" for b in first_bad[:3]))
        missing = [c for c in REQUIRED if c not in seen_columns]
        if missing:
            raise ConvertError(f"{input_path}: missing column(s) {', '.join(missing)} in every row")
        skipped = total - written
        report = ConvertReport(
            input=str(input_path.resolve()), output=str(output.resolve()), rows_read=total, rows_written=written,
            rows_skipped=skipped, skipped_by_reason=dict(sorted(reasons.items())), first_bad_rows=first_bad,
            max_bad_fraction=max_bad_fraction,
        )
        write_report(convert_report_path(output), report)
        if skipped / total > max_bad_fraction:
            raise ConvertError(
                f"{input_path}: {skipped} of {total} rows are bad ({skipped / total:.2%} > {max_bad_fraction:.2%}): "
                f"{dict(reasons)}; first bad rows: {[b.row for b in first_bad]} (see {convert_report_path(output)})"
            )
    manifest = build_manifest("convert", {"input": input_path}, params, output_sha256=sha256_file(output),
                              rows=written, skipped=skipped)
    write_manifest(manifest_path(output), manifest)
    log.info("wrote %d conversations to %s (%d rows skipped)", written, output, skipped)
    return report


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workloads.data.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="input .parquet, .json or .jsonl file")
    parser.add_argument("--output", required=True, help="output .jsonl file")
    parser.add_argument("--max-bad-fraction", type=float, default=0.01, help="fail above this share of bad rows")
    parser.add_argument("--limit", type=int, help="convert only the first N rows")
    parser.add_argument("--keep", action="append", default=[], metavar="COLUMN",
                        help="carry this column beside messages (e.g. a document id for split --group-by)")
    args = parser.parse_args(argv)
    try:
        report = convert(args.input, args.output, args.max_bad_fraction, args.limit, tuple(args.keep))
    except ConvertError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(report.model_dump_json(include={"output", "rows_read", "rows_written", "rows_skipped"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
