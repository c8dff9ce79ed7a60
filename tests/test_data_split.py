"""split: deterministic for a seed, ratio respected, duplicates kept on one side, bad lines named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.data.split import SplitError, split

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, n: int, duplicate_every: int = 0) -> Path:
    lines = []
    for i in range(n):
        j = i % duplicate_every if duplicate_every and i % 3 == 0 else i
        lines.append(json.dumps({"messages": [{"role": "user", "content": f"q{j}"}, {"role": "assistant", "content": f"a{j}"}]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _read(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_same_seed_same_split_other_seed_differs(tmp_path: Path) -> None:
    results = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        source = _write(tmp_path / f"{name}.jsonl", 200)
        split(source, 0.8, shuffle=True, seed=seed)
        results.append((_read(tmp_path / f"{name}_train.jsonl"), _read(tmp_path / f"{name}_test.jsonl")))
    assert results[0] == results[1]
    assert results[0] != results[2]
    train, test = results[0]
    assert len(train) == 160 and len(test) == 40
    assert sorted(train + test) == sorted(_read(tmp_path / "a.jsonl"))


def test_without_shuffle_order_is_kept(tmp_path: Path) -> None:
    source = _write(tmp_path / "c.jsonl", 10)
    split(source, 0.7)
    assert _read(tmp_path / "c_train.jsonl") + _read(tmp_path / "c_test.jsonl") == _read(source)
    assert len(_read(tmp_path / "c_test.jsonl")) == 3


def test_duplicates_never_land_on_both_sides(tmp_path: Path) -> None:
    source = _write(tmp_path / "d.jsonl", 300, duplicate_every=7)
    report = split(source, 0.5, shuffle=True, seed=1)
    train, test = set(_read(tmp_path / "d_train.jsonl")), set(_read(tmp_path / "d_test.jsonl"))
    assert not train & test
    lines = _read(source)
    assert report.duplicate_rows == len(lines) - len(set(lines)) > 0
    assert report.duplicate_groups == sum(1 for line in set(lines) if lines.count(line) > 1)
    assert report.train_rows + report.test_rows == 300
    saved = json.loads((tmp_path / "d_split.report.json").read_text())
    assert saved == json.loads(report.model_dump_json())


def test_manifests_beside_outputs_and_rerun_is_a_no_op(tmp_path: Path) -> None:
    source = _write(tmp_path / "m.jsonl", 20)
    split(source, 0.5, shuffle=True, seed=0)
    manifest = json.loads((tmp_path / "m_train.jsonl.manifest.json").read_text())
    assert manifest["params"]["side"] == "train" and manifest["inputs"]["input"]["path"] == str(source.resolve())
    inode = (tmp_path / "m_train.jsonl").stat().st_ino
    split(source, 0.5, shuffle=True, seed=0)
    assert (tmp_path / "m_train.jsonl").stat().st_ino == inode
    split(source, 0.6, shuffle=True, seed=0)
    assert len(_read(tmp_path / "m_train.jsonl")) == 12


def test_a_damaged_stored_report_is_named_and_the_split_made_again(tmp_path: Path, caplog) -> None:
    source = _write(tmp_path / "r.jsonl", 20)
    first = split(source, 0.5)
    report_file = tmp_path / "r_split.report.json"
    damaged = json.loads(report_file.read_text())
    del damaged["train_rows"]
    report_file.write_text(json.dumps(damaged))
    with caplog.at_level("WARNING"):
        again = split(source, 0.5)
    assert f"{report_file}: not a valid split report (train_rows: Field required); splitting again" in caplog.text
    assert again == first and json.loads(report_file.read_text())["train_rows"] == 10


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.1, 1.5])
def test_ratio_out_of_range(tmp_path: Path, ratio: float) -> None:
    with pytest.raises(SplitError, match="ratio"):
        split(_write(tmp_path / "r.jsonl", 10), ratio)


def test_bad_inputs_name_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"messages": []}\n{"messages": [\n')
    with pytest.raises(SplitError, match="bad.jsonl:2: not a JSON line"):
        split(bad, 0.5)
    bad.write_bytes(b'{"messages": []}\n\xff\xfe\n')
    with pytest.raises(SplitError, match="bad.jsonl:2"):
        split(bad, 0.5)
    bad.write_text('{"rows": 1}\n')
    with pytest.raises(SplitError, match="bad.jsonl:1: expected an object with a 'messages' list"):
        split(bad, 0.5)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SplitError, match="empty.jsonl: no rows"):
        split(tmp_path / "empty.jsonl", 0.5)
    with pytest.raises(SplitError, match="test split empty"):
        split(_write(tmp_path / "one.jsonl", 1), 0.9)
    assert not (tmp_path / "bad_train.jsonl").exists() and not (tmp_path / "one_train.jsonl").exists()


def test_cli(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "workloads.data.split"]
    assert "--ratio" in subprocess.run([*run, "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    source = _write(tmp_path / "x.jsonl", 10)
    done = subprocess.run([*run, "--input", str(source), "--ratio", "0.8", "--shuffle", "--seed", "5"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and json.loads(done.stdout)["test_rows"] == 2
    failed = subprocess.run([*run, "--input", str(tmp_path / "missing.jsonl"), "--ratio", "0.8"],
                            cwd=ROOT, capture_output=True, text=True)
    assert failed.returncode == 1 and "missing.jsonl: file not found" in failed.stderr
