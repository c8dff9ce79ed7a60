"""tokenize: assistant-only labels checked token by token against the chat template, overlong rows, parallel map."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import load_from_disk

from workloads.data.convert import convert
from workloads.data.sample import sample
from workloads.data.tokenize import IGNORE, TokenizeError, tokenize

ROOT = Path(__file__).resolve().parents[1]

MULTI_TURN = [
    {"role": "system", "content": "You are a careful bank assistant."},
    {"role": "user", "content": "What is an overdraft fee?"},
    {"role": "assistant", "content": "A charge when a payment takes your balance below zero."},
    {"role": "user", "content": "How do I avoid it?"},
    {"role": "assistant", "content": "Turn on low-balance alerts and overdraft protection."},
]
NO_SYSTEM = [{"role": "user", "content": "Is APR the same as APY?"}, {"role": "assistant", "content": "No: APY includes compounding."}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _conversations(tmp_path: Path, rows: int, extra: list[list[dict]] = ()) -> Path:
    convert(sample(rows, 0, tmp_path / "raw.parquet"), tmp_path / "conv.jsonl")
    with open(tmp_path / "conv.jsonl", "a") as handle:
        for messages in extra:
            handle.write(json.dumps({"messages": messages}) + "\n")
    return tmp_path / "conv.jsonl"


def _template_ids(tokenizer, messages: list[dict]) -> list[int]:
    result = tokenizer.apply_chat_template(messages, tokenize=True)
    return list(result["input_ids"] if hasattr(result, "keys") else result)


def _expected_labels(tokenizer, ids: list[int]) -> tuple[list[int], list[list[int]]]:
    """From the token stream alone: after each `<|im_start|>assistant\\n` header, every token up to and
    including the next `<|im_end|>` is a label; everything else is ignored."""
    header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    labels, turns, i = [IGNORE] * len(ids), [], 0
    while i < len(ids):
        if ids[i : i + len(header)] == header:
            start = j = i + len(header)
            while j < len(ids) and ids[j] != end:
                j += 1
            stop = min(j + 1, len(ids))
            labels[start:stop] = ids[start:stop]
            turns.append(ids[start:stop])
            i = stop
        else:
            i += 1
    return labels, turns


def test_labels_match_the_chat_template_token_by_token(tiny_model_dir: Path, tokenizer, tmp_path: Path) -> None:
    source = _conversations(tmp_path, 40, [MULTI_TURN, NO_SYSTEM])
    tokenize(source, tiny_model_dir, 4096, tmp_path / "tok")
    dataset = load_from_disk(str(tmp_path / "tok"))
    conversations = [json.loads(line)["messages"] for line in source.read_text().splitlines()]
    assert len(dataset) == len(conversations)
    assert dataset.column_names == ["input_ids", "attention_mask", "labels", "length", "prompt_length", "row"]
    for index, (row, messages) in enumerate(zip(dataset, conversations)):
        assert row["input_ids"] == _template_ids(tokenizer, messages) and row["row"] == index
        prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True)
        assert row["prompt_length"] == len(prompt["input_ids"])
        expected, turns = _expected_labels(tokenizer, row["input_ids"])
        assert row["labels"] == expected
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert [tokenizer.decode(t) for t in turns] == [reply + "<|im_end|>" for reply in replies]
        assert row["attention_mask"] == [1] * row["length"] and row["length"] == len(row["input_ids"])
    multi = dataset[len(conversations) - 2]
    assert sum(label != IGNORE for label in multi["labels"]) == sum(
        len(tokenizer.encode(m["content"], add_special_tokens=False)) + 1 for m in MULTI_TURN if m["role"] == "assistant")
    assert tokenizer.decode(_template_ids(tokenizer, NO_SYSTEM)).startswith("<|im_start|>system\nYou are a helpful")


def test_overlong_rows_are_truncated_or_dropped_and_counted(tiny_model_dir: Path, tokenizer, tmp_path: Path) -> None:
    big = {"role": "assistant", "content": "Interest compounds monthly on the balance. " * 25_000}
    assert len(big["content"]) > 1_000_000
    source = _conversations(tmp_path, 60, [[{"role": "user", "content": "Explain interest at length."}, big]])
    conversations = [json.loads(line)["messages"] for line in source.read_text().splitlines()]
    limit = 96
    full = [_template_ids(tokenizer, m) for m in conversations]
    overlong = sum(len(ids) > limit for ids in full)
    empty_after_cut = sum(all(x == IGNORE for x in _expected_labels(tokenizer, ids[:limit])[0]) for ids in full)
    assert overlong > 5

    kept = tokenize(source, tiny_model_dir, limit, tmp_path / "trunc", overlong="truncate")
    assert kept.truncated == overlong - empty_after_cut
    assert kept.dropped_no_assistant_tokens == empty_after_cut
    assert kept.rows_written == len(conversations) - empty_after_cut
    truncated = load_from_disk(str(tmp_path / "trunc"))
    assert max(truncated["length"]) == limit
    assert truncated[-1]["input_ids"] == full[-1][:limit]

    dropped = tokenize(source, tiny_model_dir, limit, tmp_path / "drop", overlong="drop")
    assert dropped.dropped_overlong == overlong and dropped.truncated == 0
    assert dropped.rows_written == len(conversations) - overlong
    assert max(load_from_disk(str(tmp_path / "drop"))["length"]) <= limit


def test_parallel_map_gives_the_same_dataset(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = _conversations(tmp_path, 80)
    tokenize(source, tiny_model_dir, 128, tmp_path / "one", batch_size=16)
    tokenize(source, tiny_model_dir, 128, tmp_path / "two", num_proc=2, batch_size=16)
    assert load_from_disk(str(tmp_path / "one")).to_dict() == load_from_disk(str(tmp_path / "two")).to_dict()


def test_manifest_hashes_inputs_and_rerun_is_a_no_op(tiny_model_dir: Path, tmp_path: Path) -> None:
    from documents.atomic import sha256_file

    source = _conversations(tmp_path, 10)
    manifest = tokenize(source, tiny_model_dir, 256, tmp_path / "tok")
    assert manifest.inputs["input"].sha256 == sha256_file(source)
    assert manifest.inputs["tokenizer.json"].sha256 == sha256_file(tiny_model_dir / "tokenizer.json")
    on_disk = json.loads((tmp_path / "tok" / "manifest.json").read_text())
    assert on_disk["inputs"]["input"]["sha256"] == sha256_file(source) and on_disk["rows_written"] == manifest.rows_written
    inode = (tmp_path / "tok").stat().st_ino
    tokenize(source, tiny_model_dir, 256, tmp_path / "tok")
    assert (tmp_path / "tok").stat().st_ino == inode
    tokenize(source, tiny_model_dir, 128, tmp_path / "tok")
    assert (tmp_path / "tok").stat().st_ino != inode
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_bad_inputs_are_named_and_nothing_is_written(tiny_model_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "q"}]}\n{"messages": "text"}\n')
    with pytest.raises(TokenizeError, match="bad.jsonl:2: messages must be a list"):
        tokenize(bad, tiny_model_dir, 128, tmp_path / "out")
    bad.write_bytes(b'\xff{"messages": []}\n')
    with pytest.raises(TokenizeError, match="bad.jsonl:1"):
        tokenize(bad, tiny_model_dir, 128, tmp_path / "out")
    bad.write_text('{"messages": [{"role": "user", "content": "only a question"}]}\n')
    with pytest.raises(TokenizeError, match="every row was dropped"):
        tokenize(bad, tiny_model_dir, 128, tmp_path / "out")
    with pytest.raises(TokenizeError, match="no-model: model folder not found"):
        tokenize(bad, tmp_path / "no-model", 128, tmp_path / "out")
    plain = tmp_path / "plain-model"
    shutil.copytree(tiny_model_dir, plain)
    (plain / "chat_template.jinja").unlink()
    with pytest.raises(TokenizeError, match="plain-model: tokenizer has no chat template"):
        tokenize(bad, plain, 128, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli(tiny_model_dir: Path, tmp_path: Path) -> None:
    run = [sys.executable, "-m", "workloads.data.tokenize"]
    shown = subprocess.run([*run, "--help"], cwd=ROOT, capture_output=True, text=True)
    assert "--num-proc" in shown.stdout and "--overlong" in shown.stdout
    source = _conversations(tmp_path, 12)
    done = subprocess.run([*run, "--input", str(source), "--model", str(tiny_model_dir), "--max-length", "64",
                           "--out", str(tmp_path / "tok"), "--overlong", "drop"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["rows_read"] == 12 and summary["rows_kept"] + summary["dropped"]["overlong"] == 12
    assert "tokenize conv.jsonl" in done.stderr
