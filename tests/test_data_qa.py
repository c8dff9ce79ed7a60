"""Long-context finance QA through the data stages: answers survive truncation, losses are counted and bounded,
and a grouped split keeps each report's questions on one side."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import load_from_disk

from conftest import tiny_run_config
from workloads.data.convert import convert
from workloads.data.finance_qa import INSTRUCTION, document, qa_rows
from workloads.data.sample import sample
from workloads.data.shorten import MARKER, fit_context
from workloads.data.split import split
from workloads.data.tokenize import IGNORE, TokenizeError, tokenize

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def qa_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qa")
    convert(sample(240, 0, folder / "qa.parquet", "qa"), folder / "qa.jsonl", keep=("doc_id",))
    return folder / "qa.jsonl"


def _table(user: str) -> dict[tuple[str, int], int]:
    lines = user.split("\n\n")[2].splitlines()
    years = [int(y) for y in lines[0].split(" | ")[1:]]
    return {(cells[0], year): int(value.replace(",", ""))
            for cells in (line.split(" | ") for line in lines[1:]) for year, value in zip(years, cells[1:])}


def test_reports_have_several_questions_and_answers_follow_the_table() -> None:
    rows = document(0, 3)
    assert 2 <= len(rows) <= 5 and len({r["doc_id"] for r in rows}) == 1
    assert len({r["user"].split("Question: ")[0] for r in rows}) == 1
    assert len({r["user"] for r in qa_rows(300, 0)}) == 300, "questions within a report are distinct"
    for row in qa_rows(200, 1):
        assert row["user"].startswith(INSTRUCTION) and row["user"].endswith("?")
        question = row["user"].rsplit("Question: ", 1)[1]
        table = {(m.lower(), y): v for (m, y), v in _table(row["user"]).items()}
        if match := re.fullmatch(r"What was (.+) in (\d{4})\?", question):
            value = table[match.group(1), int(match.group(2))]
            assert row["assistant"] == f"${value:,} million"
        elif match := re.fullmatch(r"What was the percentage change in (.+) from (\d{4}) to (\d{4})\?", question):
            a, b = table[match.group(1), int(match.group(2))], table[match.group(1), int(match.group(3))]
            assert row["assistant"] == f"{(b - a) / a * 100:.1f}%"
        else:
            match = re.fullmatch(r"By how much did (.+) change from (\d{4}) to (\d{4})\?", question)
            a, b = table[match.group(1), int(match.group(2))], table[match.group(1), int(match.group(3))]
            assert row["assistant"] == ("-" if b < a else "") + f"${abs(b - a):,} million"


def test_no_answer_is_lost_at_512_tokens(qa_jsonl: Path, tiny_model_dir: Path, tokenizer, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in qa_jsonl.read_text().splitlines()]
    full = [len(tokenizer.apply_chat_template(r["messages"], tokenize=True)["input_ids"]) for r in rows]
    assert sum(n > 512 for n in full) > len(rows) // 3

    manifest = tokenize(qa_jsonl, tiny_model_dir, 512, tmp_path / "ctx", max_lost_fraction=0.0)
    assert manifest.rows_read == manifest.rows_written == len(rows)
    assert manifest.truncated == sum(n > 512 for n in full)
    data = load_from_disk(str(tmp_path / "ctx"))
    for item in data:
        row = rows[item["row"]]["messages"]
        answer = [t for t in item["labels"] if t != IGNORE]
        assert tokenizer.decode(answer) == row[-1]["content"] + "<|im_end|>"
        assert item["length"] <= 512 and item["labels"][: item["prompt_length"]] == [IGNORE] * item["prompt_length"]
        prompt = tokenizer.decode(item["input_ids"][: item["prompt_length"]])
        question = row[-2]["content"].rsplit("\n\n", 1)[1]
        assert INSTRUCTION in prompt and prompt.endswith(f"{question}<|im_end|>\n<|im_start|>assistant\n")
        assert (MARKER in prompt) == (full[item["row"]] > 512)

    cut = tokenize(qa_jsonl, tiny_model_dir, 512, tmp_path / "end", overlong="truncate")
    assert cut.dropped_no_assistant_tokens > len(rows) // 3


def test_losses_above_the_limit_fail_naming_cause_and_setting(qa_jsonl: Path, tiny_model_dir: Path,
                                                              tmp_path: Path) -> None:
    with pytest.raises(TokenizeError) as failure:
        tokenize(qa_jsonl, tiny_model_dir, 512, tmp_path / "end", overlong="truncate", max_lost_fraction=0.05)
    message = str(failure.value)
    assert "qa.jsonl" in message and "no assistant tokens" in message
    assert "data.max_lost_fraction 0.05" in message and "overlong: context" in message
    assert not (tmp_path / "end").exists()

    long_answer = tmp_path / "long.jsonl"
    long_answer.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Q{i}?"}, {
        "role": "assistant", "content": ("Long answer. " * 200) if i < 2 else f"A{i}."}]}) + "\n" for i in range(10)))
    with pytest.raises(TokenizeError, match=r"2 of 10 rows \(20.0%\).*2 answer too long.*larger max_length \(now 128\)"):
        tokenize(long_answer, tiny_model_dir, 128, tmp_path / "long", max_lost_fraction=0.1)
    manifest = tokenize(long_answer, tiny_model_dir, 128, tmp_path / "long", max_lost_fraction=0.2)
    assert manifest.dropped_answer_too_long == 2 and manifest.rows_written == 8 and manifest.lost_fraction == 0.2


def test_multi_turn_drops_earliest_turns_first(tokenizer) -> None:
    turns = [{"role": "system", "content": "You are a bank assistant."}]
    for i in range(4):
        turns += [{"role": "user", "content": f"Question {i}: " + "about fees " * 30},
                  {"role": "assistant", "content": f"Answer {i}: " + "it depends " * 20}]
    full = len(tokenizer.apply_chat_template(turns, tokenize=True)["input_ids"])
    fitted = fit_context(tokenizer, turns, full - 50)
    assert [m["content"][:10] for m in fitted] == ["You are a ", "Question 1", "Answer 1: ", "Question 2",
                                                   "Answer 2: ", "Question 3", "Answer 3: "]
    assert fitted[-1] == turns[-1] and fitted[-2] == turns[-2]
    single = fit_context(tokenizer, turns, 110)
    assert single[0] == turns[0] and single[-1] == turns[-1] and len(single) == 3
    assert single[1]["content"].startswith("Question 3") and MARKER in single[1]["content"]
    assert fit_context(tokenizer, turns, 40) is None


def test_grouped_split_keeps_each_report_on_one_side(qa_jsonl: Path, tmp_path: Path) -> None:
    def documents(path: Path) -> set[str]:
        return {json.loads(line)["doc_id"] for line in path.read_text().splitlines()}

    source = tmp_path / "qa.jsonl"
    source.write_text(qa_jsonl.read_text())
    loose = split(source, 0.8, shuffle=True, seed=0)
    assert documents(Path(loose.train)) & documents(Path(loose.test)), "rows of one report leak without grouping"

    report = split(source, 0.8, shuffle=True, seed=0, group_by="doc_id")
    train, test = documents(Path(report.train)), documents(Path(report.test))
    assert not train & test
    assert report.groups == len(train | test) == report.train_groups + report.test_groups
    assert (report.train_groups, report.test_groups) == (len(train), len(test))
    assert report.train_rows + report.test_rows == 240 and abs(report.train_rows - 192) <= 5

    done = subprocess.run([sys.executable, "-m", "workloads.data.split", "--input", str(source), "--ratio", "0.8",
                           "--shuffle", "--group-by", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1 and "qa.jsonl:1: no 'nope' value to group by" in done.stderr


def test_prepare_summary_counts_every_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    from workloads.prepare import run

    config = tiny_run_config(tmp_path, tiny_model_dir, rows=60, source="sample:qa", group_by="doc_id",
                             max_length=512, overlong="context", max_lost_fraction=0.0)
    summary = run(config)
    assert summary.convert.rows_read == summary.convert.rows_kept == 60
    assert summary.split.group_by == "doc_id" and summary.split.train_groups + summary.split.test_groups == summary.split.groups
    train, test = summary.tokenized["train"], summary.tokenized["test"]
    assert train.rows_read == summary.split.train_rows and test.rows_read == summary.split.test_rows
    assert train.rows_kept + test.rows_kept == 60 and train.truncated + test.truncated > 0
    assert train.dropped == {"overlong": 0, "answer_too_long": 0, "no_assistant_tokens": 0}
    text = "\n".join(summary.lines())
    assert "tokenize train:" in text and "truncated (overlong context, max_length 512)" in text
    assert "dropped 0, lost 0.0%" in text
    lossy = summary.model_copy(update={"tokenized": {"train": train.model_copy(
        update={"dropped": {"overlong": 0, "answer_too_long": 3, "no_assistant_tokens": 1}})}})
    assert "dropped 4 (answer too long 3, no assistant tokens 1), lost" in "\n".join(lossy.lines())


def test_prepare_checks_the_data_before_the_base_model(tmp_path: Path) -> None:
    from workloads.data.convert import ConvertError
    from workloads.prepare import run

    bad = tmp_path / "finance.jsonl"
    bad.write_text(json.dumps({"question": "Q?", "answer": "A."}) + "\n")
    config = tiny_run_config(tmp_path / "run", tmp_path / "no-such-model", source=f"file:{bad}")
    with pytest.raises(ConvertError, match=r"finance.jsonl: missing column\(s\) user, assistant"):
        run(config)
    assert not config.base_model_dir.exists()
