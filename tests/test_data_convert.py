"""convert: good parquet/json/jsonl, bad rows counted by reason, bad files named, nothing half-written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workloads.data.convert import ConvertError, convert
from workloads.data.sample import sample

ROOT = Path(__file__).resolve().parents[1]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_parquet_to_messages_omits_empty_system(tmp_path: Path) -> None:
    raw = sample(200, 0, tmp_path / "raw.parquet")
    source = pq.read_table(raw).to_pylist()
    report = convert(raw, tmp_path / "conv.jsonl")
    out = _lines(tmp_path / "conv.jsonl")
    assert report.rows_written == len(out) == 200 and report.rows_skipped == 0
    for row, line in zip(source, out):
        roles = [m["role"] for m in line["messages"]]
        assert roles == (["system", "user", "assistant"] if row["system"] else ["user", "assistant"])
        assert line["messages"][-1]["content"] == row["assistant"]
        assert line["messages"][-2]["content"] == row["user"]
    assert json.loads((tmp_path / "conv.report.json").read_text())["rows_read"] == 200
    manifest = json.loads((tmp_path / "conv.jsonl.manifest.json").read_text())
    assert manifest["inputs"]["input"]["path"] == str(raw.resolve())


def test_json_array_and_column_object(tmp_path: Path) -> None:
    rows = [{"system": "", "user": "What is APR?", "assistant": "The yearly rate."},
            {"system": "Be brief.", "user": "What is APY?", "assistant": "APR with compounding."}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "c.json").write_text(json.dumps({k: [r[k] for r in rows] for k in rows[0]}))
    convert(tmp_path / "a.json", tmp_path / "a.jsonl")
    convert(tmp_path / "c.json", tmp_path / "c.jsonl")
    assert _lines(tmp_path / "a.jsonl") == _lines(tmp_path / "c.jsonl")
    assert _lines(tmp_path / "a.jsonl")[1]["messages"][0] == {"role": "system", "content": "Be brief."}


def test_bad_rows_are_skipped_and_counted_by_reason(tmp_path: Path) -> None:
    good = {"user": "Q", "assistant": "A"}
    path = tmp_path / "in.jsonl"
    lines = [json.dumps(good)] * 10 + [
        json.dumps({"assistant": "A"}),
        json.dumps({"user": "", "assistant": "A"}),
        json.dumps({"user": "Q", "assistant": "   "}),
        json.dumps({"user": 42, "assistant": "A"}),
        json.dumps({"user": "Q", "assistant": ["A"]}),
        json.dumps({"user": "Q", "assistant": "A", "system": 3}),
        "{not json",
        json.dumps(["a", "list"]),
    ]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"user": "\xff\xfe", "assistant": "A"}\n')
    report = convert(path, tmp_path / "out.jsonl", max_bad_fraction=1.0)
    assert report.rows_read == 19 and report.rows_written == 10
    assert report.skipped_by_reason == {
        "assistant_empty": 1, "assistant_not_string": 1, "invalid_json": 1, "not_an_object": 1, "not_utf8": 1,
        "system_not_string": 1, "user_empty": 1, "user_missing": 1, "user_not_string": 1,
    }
    assert [b.row for b in report.first_bad_rows] == list(range(11, 20))
    assert len(_lines(tmp_path / "out.jsonl")) == 10


def test_above_bad_fraction_fails_with_counts_and_rows_and_writes_nothing(tmp_path: Path) -> None:
    rows = [{"user": "Q", "assistant": "A"}] * 97 + [{"user": None, "assistant": "A"}] * 3
    with pytest.raises(ConvertError) as error:
        convert(_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl", max_bad_fraction=0.01)
    message = str(error.value)
    assert "in.jsonl" in message and "3 of 100" in message and "user_missing" in message and "[98, 99, 100]" in message
    assert not (tmp_path / "out.jsonl").exists()
    assert json.loads((tmp_path / "out.report.json").read_text())["rows_skipped"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.report.json"]
    assert convert(tmp_path / "in.jsonl", tmp_path / "out.jsonl", max_bad_fraction=0.05).rows_written == 97


def test_malformed_parquet_names_the_file(tmp_path: Path) -> None:
    raw = sample(50, 0, tmp_path / "raw.parquet")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(raw.read_bytes()[: raw.stat().st_size // 2])
    with pytest.raises(ConvertError, match="broken.parquet: unreadable parquet file"):
        convert(broken, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_missing_column_names_file_and_column(tmp_path: Path) -> None:
    pq.write_table(pa.table({"system": ["s"], "user": ["q"], "answer": ["a"]}), tmp_path / "cols.parquet")
    with pytest.raises(ConvertError, match="cols.parquet: missing column\\(s\\) assistant"):
        convert(tmp_path / "cols.parquet", tmp_path / "out.jsonl")
    _jsonl(tmp_path / "cols.jsonl", [{"question": "q", "assistant": "a"}] * 3)
    with pytest.raises(ConvertError, match="cols.jsonl: missing column\\(s\\) user"):
        convert(tmp_path / "cols.jsonl", tmp_path / "out.jsonl", max_bad_fraction=1.0)
    assert not (tmp_path / "out.jsonl").exists()


def test_wrong_column_types_in_parquet_are_bad_rows(tmp_path: Path) -> None:
    table = pa.table({"user": pa.array([1, 2, 3], pa.int64()), "assistant": ["a", "b", "c"]})
    pq.write_table(table, tmp_path / "types.parquet")
    with pytest.raises(ConvertError, match="3 of 3 rows are bad.*user_not_string"):
        convert(tmp_path / "types.parquet", tmp_path / "out.jsonl")


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.parquet", "empty.json"])
def test_empty_file(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(ConvertError, match=f"{name}: file is empty"):
        convert(tmp_path / name, tmp_path / "out.jsonl")


def test_no_rows_and_blank_lines_only(tmp_path: Path) -> None:
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(ConvertError, match="blank.jsonl: no rows"):
        convert(tmp_path / "blank.jsonl", tmp_path / "out.jsonl")
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(ConvertError, match="empty.json: no rows"):
        convert(tmp_path / "empty.json", tmp_path / "out.jsonl")


def test_non_utf8_json_document_and_unknown_type(tmp_path: Path) -> None:
    (tmp_path / "latin.json").write_bytes('[{"user": "caf\u00e9", "assistant": "a"}]'.encode("latin-1"))
    with pytest.raises(ConvertError, match="latin.json: not UTF-8"):
        convert(tmp_path / "latin.json", tmp_path / "out.jsonl")
    (tmp_path / "data.csv").write_text("user,assistant\nq,a\n")
    with pytest.raises(ConvertError, match="data.csv: unsupported file type"):
        convert(tmp_path / "data.csv", tmp_path / "out.jsonl")
    with pytest.raises(ConvertError, match="nope.jsonl: file not found"):
        convert(tmp_path / "nope.jsonl", tmp_path / "out.jsonl")


def test_one_megabyte_row_passes_through_intact(tmp_path: Path) -> None:
    big = "The annual percentage rate explained. " * 28_000
    assert len(big) > 1_000_000
    _jsonl(tmp_path / "big.jsonl", [{"user": "Explain APR in depth.", "assistant": big}, {"user": "Q", "assistant": "A"}])
    convert(tmp_path / "big.jsonl", tmp_path / "out.jsonl")
    assert _lines(tmp_path / "out.jsonl")[0]["messages"][1]["content"] == big


def test_limit_and_rerun_is_a_no_op(tmp_path: Path) -> None:
    raw = sample(30, 0, tmp_path / "raw.parquet")
    assert convert(raw, tmp_path / "out.jsonl", limit=10).rows_written == 10
    inode = (tmp_path / "out.jsonl").stat().st_ino
    convert(raw, tmp_path / "out.jsonl", limit=10)
    assert (tmp_path / "out.jsonl").stat().st_ino == inode


def test_cli_exit_codes(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "workloads.data.convert"]
    assert "--max-bad-fraction" in subprocess.run([*run, "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    _jsonl(tmp_path / "in.jsonl", [{"user": "Q", "assistant": "A"}, {"user": "Q"}])
    failed = subprocess.run([*run, "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl")],
                            cwd=ROOT, capture_output=True, text=True)
    assert failed.returncode == 1 and "1 of 2 rows are bad" in failed.stderr and "first bad rows: [2]" in failed.stderr
    done = subprocess.run([*run, "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl"),
                           "--max-bad-fraction", "0.5"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and json.loads(done.stdout)["rows_written"] == 1


def test_a_lone_surrogate_is_a_bad_row_with_its_line_number(tmp_path: Path) -> None:
    """JSON's `\\ud800` escape decodes to a lone surrogate that no UTF-8 file can hold (issue 42, item 4)."""
    path = tmp_path / "in.jsonl"
    path.write_text('{"user": "Q", "assistant": "A"}\n{"user": "\\ud800", "assistant": "A"}\n'
                    '{"user": "Q", "assistant": "A", "system": "x\\udfff"}\n{"user": "Q", "assistant": "A"}\n',
                    encoding="ascii")
    report = convert(path, tmp_path / "out.jsonl", max_bad_fraction=0.5)
    assert report.rows_written == 2 and report.skipped_by_reason == {"user_not_unicode": 1, "system_not_unicode": 1}
    assert [b.row for b in report.first_bad_rows] == [2, 3]
    assert _lines(tmp_path / "out.jsonl") == [{"messages": [{"role": "user", "content": "Q"},
                                                            {"role": "assistant", "content": "A"}]}] * 2
    with pytest.raises(ConvertError, match=r"first bad rows: \[2, 3\]"):
        convert(path, tmp_path / "strict.jsonl", max_bad_fraction=0.01)
    assert not (tmp_path / "strict.jsonl").exists()
