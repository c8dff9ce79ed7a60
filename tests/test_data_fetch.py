"""fetch: a downloaded dataset folder reduced to one convertible file; an unreachable hub is a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workloads.data.convert import convert
from workloads.data.fetch import FetchError, data_file, fetch


def test_parquet_shards_are_joined_in_order(tmp_path: Path) -> None:
    folder = tmp_path / "hub" / "data"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"system": ["", "s"], "user": ["q1", "q2"], "assistant": ["a1", "a2"], "extra": [1, 2]}),
                   folder / "train-00000-of-00002.parquet")
    pq.write_table(pa.table({"user": ["q3"], "assistant": ["a3"]}), folder / "train-00001-of-00002.parquet")
    out = data_file(tmp_path / "hub", tmp_path / "raw.parquet")
    assert out == tmp_path / "raw.parquet"
    assert pq.read_table(out).to_pylist() == [
        {"system": "", "user": "q1", "assistant": "a1"},
        {"system": "s", "user": "q2", "assistant": "a2"},
        {"system": None, "user": "q3", "assistant": "a3"},
    ]
    assert convert(out, tmp_path / "conv.jsonl").rows_written == 3


def test_single_json_dataset_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "dataset_info.json").write_text("{}")
    data = tmp_path / "hub" / "finance.json"
    data.write_text(json.dumps([{"system": "", "user": "q", "assistant": "a"}]))
    assert data_file(tmp_path / "hub", tmp_path / "raw.parquet") == data


def test_shard_without_columns_and_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "hub").mkdir()
    with pytest.raises(FetchError, match="no .parquet, .json or .jsonl data files"):
        data_file(tmp_path / "hub", tmp_path / "raw.parquet")
    pq.write_table(pa.table({"question": ["q"]}), tmp_path / "hub" / "x.parquet")
    with pytest.raises(FetchError, match="x.parquet: missing column"):
        data_file(tmp_path / "hub", tmp_path / "raw.parquet")
    assert not (tmp_path / "raw.parquet").exists()


def test_unreachable_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(FetchError, match="hub:Josephgflowers/Finance-Instruct-500k: cannot download"):
        fetch("Josephgflowers/Finance-Instruct-500k", tmp_path / "raw.parquet")
    assert not (tmp_path / "raw.parquet").exists()
