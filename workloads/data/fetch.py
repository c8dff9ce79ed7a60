"""Download a dataset from the Hugging Face Hub and reduce it to one file that `convert` reads.

    python -m workloads.data.fetch --source hub:Josephgflowers/Finance-Instruct-500k --out raw.parquet

Parquet shards are joined into `--out` (columns system, user, assistant); a dataset published as a single
.json or .jsonl file is used as it is.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from documents.atomic import atomic_file, sha256_file
from documents.stage_manifest import manifest_path, write_manifest
from workloads.data.freshness import build_manifest

log = logging.getLogger("workloads.data.fetch")

PATTERNS = ["*.parquet", "**/*.parquet", "*.json", "*.jsonl", "**/*.json", "**/*.jsonl"]
COLUMNS = ("system", "user", "assistant")


class FetchError(RuntimeError):
    """The dataset cannot be downloaded or has no usable data file."""


def join_parquet(files: list[Path], out: Path) -> Path:
    """Stream the shards' system/user/assistant columns into one parquet file (atomic)."""
    schema = pa.schema([(name, pa.string()) for name in COLUMNS])
    with atomic_file(out) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        for file in files:
            try:
                shard = pq.ParquetFile(file)
            except (pa.ArrowException, OSError) as error:
                raise FetchError(f"{file}: unreadable parquet shard: {error}") from None
            missing = [c for c in COLUMNS[1:] if c not in shard.schema_arrow.names]
            if missing:
                raise FetchError(f"{file}: missing column(s) {', '.join(missing)}")
            for batch in shard.iter_batches():
                table = pa.Table.from_batches([batch])
                arrays = [table[c].cast(pa.string()) if c in table.column_names else pa.nulls(len(table), pa.string())
                          for c in COLUMNS]
                writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
    return out


def data_file(folder: Path, out: Path) -> Path:
    """The file `convert` should read from a downloaded dataset folder."""
    shards = sorted(p for p in folder.rglob("*.parquet") if ".cache" not in p.parts)
    if shards:
        return join_parquet(shards, out)
    candidates = sorted((p for p in folder.rglob("*.json*") if p.suffix in (".json", ".jsonl") and ".cache" not in p.parts
                         and p.name not in ("dataset_info.json", "config.json")), key=lambda p: p.stat().st_size)
    if not candidates:
        raise FetchError(f"{folder}: no .parquet, .json or .jsonl data files")
    return candidates[-1]


def fetch(repo_id: str, out: str | Path, revision: str | None = None) -> Path:
    """Download `repo_id` (a dataset) beside `out` and return the file to convert."""
    from huggingface_hub import snapshot_download

    out = Path(out)
    folder = out.parent / "hub" / repo_id.replace("/", "__")
    log.info("downloading dataset %s to %s", repo_id, folder)
    try:
        snapshot_download(repo_id, repo_type="dataset", revision=revision, local_dir=folder, allow_patterns=PATTERNS)
    except Exception as error:
        raise FetchError(f"hub:{repo_id}: cannot download the dataset from the Hugging Face Hub "
                         f"({type(error).__name__}: {error}). Check network access and HF_TOKEN, or download it "
                         "elsewhere and use file:PATH.") from None
    result = data_file(folder, out)
    if result == out:
        write_manifest(manifest_path(out), build_manifest("fetch", {}, {"source": f"hub:{repo_id}", "revision": revision},
                                                          output_sha256=sha256_file(out)))
    return result


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workloads.data.fetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="hub:ORG/NAME")
    parser.add_argument("--out", required=True, help="parquet file to write when the dataset is sharded parquet")
    parser.add_argument("--revision", help="dataset revision")
    args = parser.parse_args(argv)
    if not args.source.startswith("hub:"):
        parser.error("--source must be hub:ORG/NAME")
    try:
        path = fetch(args.source[4:], args.out, args.revision)
    except FetchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"data_file": str(path.resolve())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
