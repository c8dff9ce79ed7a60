"""Data stages on a full disk, a read-only folder, mislabelled files and one enormous row.

The full and read-only folders are real: a small tmpfs mounted for the test (needs root; skipped otherwise).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workloads.data.convert import ConvertError, convert
from workloads.data.sample import sample

ROOT = Path(__file__).resolve().parents[1]


def _mount(path: Path, size: str) -> None:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: writing more than that fails with ENOSPC."""
    path = tmp_path / "small"
    _mount(path, "256k")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs holding `conv.jsonl`, then remounted read-only (root ignores chmod, a read-only mount does not)."""
    path = tmp_path / "ro"
    _mount(path, "4m")
    try:
        convert(sample(40, 0, tmp_path / "raw.parquet"), path / "conv.jsonl")
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def _cli(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"workloads.data.{module}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def _one_clear_line(done: subprocess.CompletedProcess[str], path: Path, cause: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert str(path) in errors[0] and cause in errors[0], errors[0]


def test_read_only_output_is_one_line_naming_path_and_cause(read_only: Path, tmp_path: Path,
                                                              tiny_model_dir: Path) -> None:
    raw = tmp_path / "raw.parquet"
    _one_clear_line(_cli("convert", "--input", str(raw), "--output", str(read_only / "out.jsonl")),
                    read_only / "out.jsonl", "Read-only file system")
    _one_clear_line(_cli("split", "--input", str(read_only / "conv.jsonl"), "--ratio", "0.9"),
                    read_only / "conv_train.jsonl", "Read-only file system")
    _one_clear_line(_cli("tokenize", "--input", str(read_only / "conv.jsonl"), "--model", str(tiny_model_dir),
                         "--max-length", "64", "--out", str(read_only / "tok")),
                    read_only / "tok", "Read-only file system")
    assert sorted(p.name for p in read_only.iterdir()) == ["conv.jsonl", "conv.jsonl.manifest.json",
                                                           "conv.report.json"]


def test_full_disk_is_one_line_naming_path_and_cause(small_disk: Path, tmp_path: Path,
                                                      tiny_model_dir: Path) -> None:
    raw = sample(2000, 0, tmp_path / "raw.parquet")
    _one_clear_line(_cli("convert", "--input", str(raw), "--output", str(small_disk / "out.jsonl")),
                    small_disk / "out.jsonl", "No space left on device")
    assert list(small_disk.iterdir()) == []
    convert(sample(300, 0, tmp_path / "raw300.parquet"), tmp_path / "conv.jsonl")
    assert 128 * 1024 < (tmp_path / "conv.jsonl").stat().st_size < 256 * 1024
    shutil.copy(tmp_path / "conv.jsonl", small_disk / "conv.jsonl")
    _one_clear_line(_cli("split", "--input", str(small_disk / "conv.jsonl"), "--ratio", "0.5"),
                    small_disk / "conv_", "No space left on device")
    (small_disk / "conv.jsonl").unlink()
    _one_clear_line(_cli("tokenize", "--input", str(tmp_path / "conv.jsonl"), "--model", str(tiny_model_dir),
                         "--max-length", "256", "--out", str(small_disk / "tok")),
                    small_disk / "tok", "No space left on device")
    assert list(small_disk.iterdir()) == []


def test_json_array_named_jsonl_says_what_the_file_is(tmp_path: Path) -> None:
    rows = [{"user": "What is APR?", "assistant": "The yearly rate."}] * 3
    pretty = tmp_path / "pretty.jsonl"
    pretty.write_text(json.dumps(rows, indent=2))
    with pytest.raises(ConvertError, match=r"pretty.jsonl: .*JSON array.*not JSON lines.*\.json"):
        convert(pretty, tmp_path / "out.jsonl")
    one_line = tmp_path / "one-line.jsonl"
    one_line.write_text(json.dumps(rows) + "\n")
    with pytest.raises(ConvertError, match=r"one-line.jsonl: .*JSON array.*not JSON lines.*\.json"):
        convert(one_line, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_parquet_named_jsonl_says_what_the_file_is(tmp_path: Path) -> None:
    renamed = tmp_path / "data.jsonl"
    pq.write_table(pa.table({"user": ["q"], "assistant": ["a"]}), renamed)
    with pytest.raises(ConvertError, match=r"data.jsonl: .*Parquet file.*\.parquet"):
        convert(renamed, tmp_path / "out.jsonl")
    json_named_parquet = tmp_path / "data.parquet"
    json_named_parquet.write_text(json.dumps({"user": "q", "assistant": "a"}) + "\n")
    with pytest.raises(ConvertError, match=r"data.parquet: .*JSON.*not a Parquet file"):
        convert(json_named_parquet, tmp_path / "out.jsonl")


_PEAK = """
import json, resource, sys
from workloads.data.tokenize import tokenize
tokenize(sys.argv[1], sys.argv[2], 64, sys.argv[3], "truncate")
print(json.dumps({"peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _peak_kib(source: Path, model: Path, out: Path) -> int:
    done = subprocess.run([sys.executable, "-c", _PEAK, str(source), str(model), str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_kib"]


def test_one_huge_row_is_capped_before_tokenizing(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A 12 MB reply costs about 1.7 GB to tokenize whole; capped, the run needs little more than a small file."""
    from datasets import load_from_disk

    small = tmp_path / "small.jsonl"
    question = {"role": "user", "content": "Summarise the statement."}
    small.write_text(json.dumps({"messages": [question, {"role": "assistant", "content": "Balance 10."}]}) + "\n")
    huge = tmp_path / "huge.jsonl"
    words = "balance interest fee " * (12_000_000 // 21)
    huge.write_text(small.read_text() + json.dumps({"messages": [question, {"role": "assistant", "content": words}]})
                    + "\n")
    baseline = _peak_kib(small, tiny_model_dir, tmp_path / "tok-small")
    peak = _peak_kib(huge, tiny_model_dir, tmp_path / "tok-huge")
    assert peak - baseline < 400 * 1024, (baseline, peak)
    rows = load_from_disk(str(tmp_path / "tok-huge"))
    assert rows["length"] == [rows["length"][0], 64]
    manifest = json.loads((tmp_path / "tok-huge" / "manifest.json").read_text())
    assert manifest["truncated"] == 1
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prefix = tokenizer.apply_chat_template([question, {"role": "assistant", "content": words[:20_000]}], tokenize=False)
    assert rows["input_ids"][1] == tokenizer(prefix, add_special_tokens=False)["input_ids"][:64]
