"""Generate synthetic finance conversations with Finance-Instruct-500k's columns.

    python -m workloads.data.sample --rows 2000 --seed 0 --out raw.parquet
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

from workloads.common.atomic import atomic_file, build_manifest, is_current, manifest_path, sha256_file, write_json_atomic
from workloads.data.synthetic import conversation

log = logging.getLogger("workloads.data.sample")

SCHEMA = pa.schema([("system", pa.string()), ("user", pa.string()), ("assistant", pa.string())])
GENERATOR = "workloads.data.synthetic/1"


def sample(rows: int, seed: int, out: str | Path) -> Path:
    """Write `rows` synthetic conversations to a parquet file (atomic, with manifest); no-op if current."""
    if rows <= 0:
        raise ValueError(f"rows must be positive, got {rows}")
    out = Path(out)
    params = {"rows": rows, "seed": seed, "generator": GENERATOR}
    if is_current(out, "sample", {}, params):
        log.info("%s is up to date", out)
        return out
    columns: dict[str, list[str]] = {"system": [], "user": [], "assistant": []}
    for index in tqdm(range(rows), desc="sample", unit="row", disable=None):
        for key, value in conversation(seed, index).items():
            columns[key].append(value)
    with atomic_file(out) as tmp:
        pq.write_table(pa.table(columns, schema=SCHEMA), tmp)
    write_json_atomic(manifest_path(out), build_manifest("sample", {}, params, output_sha256=sha256_file(out)))
    log.info("wrote %d rows to %s", rows, out)
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workloads.data.sample", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, required=True, help="number of conversations")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (same seed, same rows)")
    parser.add_argument("--out", required=True, help="output .parquet file")
    args = parser.parse_args(argv)
    if args.rows <= 0:
        parser.error("--rows must be positive")
    sample(args.rows, args.seed, args.out)
    print(json.dumps({"output": str(Path(args.out).resolve()), "rows": args.rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
