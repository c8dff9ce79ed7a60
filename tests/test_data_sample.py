"""Synthetic conversations: deterministic per seed, Finance-Instruct columns, varied topics and lengths."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from workloads.data.sample import sample
from workloads.data.synthetic import conversation

ROOT = Path(__file__).resolve().parents[1]


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_same_seed_same_rows_other_seed_other_rows(tmp_path: Path) -> None:
    a = _rows(sample(300, 7, tmp_path / "a.parquet"))
    b = _rows(sample(300, 7, tmp_path / "b.parquet"))
    c = _rows(sample(300, 8, tmp_path / "c.parquet"))
    assert a == b
    assert a != c
    assert _rows(sample(100, 7, tmp_path / "short.parquet")) == a[:100]


def test_columns_and_types_match_finance_instruct(tmp_path: Path) -> None:
    table = pq.read_table(sample(50, 0, tmp_path / "raw.parquet"))
    assert table.column_names == ["system", "user", "assistant"]
    assert all(str(t) == "string" for t in table.schema.types)
    assert table.num_rows == 50


def test_topics_and_lengths_vary(tmp_path: Path) -> None:
    rows = _rows(sample(1000, 0, tmp_path / "raw.parquet"))
    text = " ".join(r["user"] + " " + r["assistant"] for r in rows).lower()
    for word in ("apr", "loan", "fee", "credit card", "fraud", "can't", "savings", "mortgage", "mid-market"):
        assert word in text, word
    lengths = sorted(len(r["assistant"]) for r in rows)
    assert lengths[0] < 150 and lengths[-1] > 1500
    assert lengths[len(lengths) // 2] < lengths[int(len(lengths) * 0.95)] / 2
    empty_system = sum(1 for r in rows if not r["system"]) / len(rows)
    assert 0.4 < empty_system < 0.8
    assert len({r["user"] for r in rows}) > 300


def test_figures_are_computed() -> None:
    pattern = re.compile(r"If I borrow \$([\d,.]+) at ([\d.]+)% APR for (\d+) years")
    checked = 0
    for index in range(500):
        row = conversation(0, index)
        match = pattern.match(row["user"])
        if match:
            principal, rate, years = float(match[1].replace(",", "")), float(match[2]) / 1200, int(match[3])
            payment = principal * rate / (1 - (1 + rate) ** (-12 * years))
            assert f"about ${payment:,.2f}" in row["assistant"]
            checked += 1
    assert checked >= 3
    assert "about $444.89" in next(
        conversation(0, i)["assistant"] for i in range(500)
        if conversation(0, i)["user"].startswith("If I borrow $20,000.00 at 12.0% APR for 5 years")
    )


def test_manifest_and_no_op_rerun(tmp_path: Path) -> None:
    out = sample(20, 1, tmp_path / "raw.parquet")
    manifest = json.loads((tmp_path / "raw.parquet.manifest.json").read_text())
    assert manifest["params"]["rows"] == 20 and manifest["params"]["seed"] == 1
    inode = out.stat().st_ino
    sample(20, 1, out)
    assert out.stat().st_ino == inode
    sample(21, 1, out)
    assert out.stat().st_ino != inode and pq.read_table(out).num_rows == 21


def test_cli(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "workloads.data.sample"]
    assert "--rows" in subprocess.run([*run, "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    done = subprocess.run([*run, "--rows", "5", "--seed", "2", "--out", str(tmp_path / "x.parquet")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 5
    bad = subprocess.run([*run, "--rows", "0", "--out", str(tmp_path / "y.parquet")], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--rows must be positive" in bad.stderr
    assert not (tmp_path / "y.parquet").exists()
