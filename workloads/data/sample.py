"""Generate synthetic finance data: conversations with Finance-Instruct-500k's columns, or long-context QA.

    python -m workloads.data.sample --rows 2000 --seed 0 --out raw.parquet [--kind conversations|qa]

`qa` rows (workloads.data.finance_qa) are a report table and paragraphs, then a question with a short
numeric answer, several questions per report, and carry a `doc_id` column for a grouped split.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from documents.atomic import atomic_file, sha256_file
from documents.stage_manifest import manifest_path, write_manifest
from workloads.data.finance_qa import qa_rows
from workloads.data.freshness import build_manifest, is_current
from workloads.data.synthetic import conversation

log = logging.getLogger("workloads.data.sample")

COLUMNS = {"conversations": ("system", "user", "assistant"), "qa": ("system", "user", "assistant", "doc_id")}
GENERATORS = {"conversations": "workloads.data.synthetic/1", "qa": "workloads.data.finance_qa/1"}
KINDS = tuple(COLUMNS)


def _rows(kind: str, rows: int, seed: int) -> list[dict[str, str]]:
    if kind == "qa":
        return qa_rows(rows, seed)
    return [conversation(seed, index) for index in tqdm(range(rows), desc="sample", unit="row", disable=None)]


def sample(rows: int, seed: int, out: str | Path, kind: str = "conversations") -> Path:
    """Write `rows` synthetic rows of `kind` to a parquet file (atomic, with manifest); no-op if current."""
    if rows <= 0:
        raise ValueError(f"rows must be positive, got {rows}")
    if kind not in COLUMNS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    out = Path(out)
    params = {"rows": rows, "seed": seed, "generator": GENERATORS[kind]}
    if is_current(out, "sample", {}, params):
        log.info("%s is up to date", out)
        return out
    generated = _rows(kind, rows, seed)
    columns = {name: [row[name] for row in generated] for name in COLUMNS[kind]}
    schema = pa.schema([(name, pa.string()) for name in COLUMNS[kind]])
    with atomic_file(out) as tmp:
        pq.write_table(pa.table(columns, schema=schema), tmp)
    write_manifest(manifest_path(out), build_manifest("sample", {}, params, output_sha256=sha256_file(out)))
    log.info("wrote %d rows to %s", rows, out)
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workloads.data.sample", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, required=True, help="number of conversations")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (same seed, same rows)")
    parser.add_argument("--out", required=True, help="output .parquet file")
    parser.add_argument("--kind", choices=KINDS, default="conversations",
                        help="conversations (Finance-Instruct-500k-like) or qa (long-context report QA)")
    args = parser.parse_args(argv)
    if args.rows <= 0:
        parser.error("--rows must be positive")
    sample(args.rows, args.seed, args.out, args.kind)
    print(json.dumps({"output": str(Path(args.out).resolve()), "rows": args.rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
