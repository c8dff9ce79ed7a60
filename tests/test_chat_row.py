"""The chat row (documents/chat_row.py): one reader and one writer for the JSONL every data stage hands on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from documents.chat_row import ChatRow, ChatRowError, chat_row_line, read_chat_rows


def test_a_row_written_reads_back_with_its_kept_column_and_line_number(tmp_path: Path) -> None:
    rows = [ChatRow.from_columns("", "What was Q3 revenue?", "$4.2B", report="r-17"),
            ChatRow.from_columns("You are an analyst.", "Net margin?", "12 %", report="r-18")]
    path = tmp_path / "chat.jsonl"
    path.write_text(chat_row_line(rows[0]) + "\n" + chat_row_line(rows[1]), encoding="utf-8")
    read = list(read_chat_rows(path))
    assert [number for number, _, _ in read] == [1, 3]
    assert [row for _, _, row in read] == rows
    first = json.loads(read[0][1])
    assert first == {"messages": [{"role": "user", "content": "What was Q3 revenue?"},
                                  {"role": "assistant", "content": "$4.2B"}], "report": "r-17"}
    assert read[1][2].turns()[0] == {"role": "system", "content": "You are an analyst."}
    assert read[1][2].kept("report") == "r-18" and read[1][2].kept("absent") is None


@pytest.mark.parametrize(("content", "message"), [
    (b'{"messages": [\n', r"bad.jsonl:2: not a JSON line"),
    (b"\xff\xfe\n", r"bad.jsonl:2: not a JSON line"),
    (b'{"rows": 1}\n', r"bad.jsonl:2: expected an object with a 'messages' list"),
    (b'["messages"]\n', r"bad.jsonl:2: expected an object with a 'messages' list"),
    (b'{"messages": "text"}\n', r"bad.jsonl:2: messages must be a list of \{role, content\} strings"),
    (b'{"messages": [{"role": "user", "content": 7}]}\n', r"bad.jsonl:2: messages must be a list"),
    (b'{"messages": [{"role": "user"}]}\n', r"bad.jsonl:2: messages must be a list"),
    (b'{"messages": ' + b"[" * 100_000 + b"\n", r"bad.jsonl:2: not a JSON line"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"messages": []}\n' + content)
    with pytest.raises(ChatRowError, match=message):
        list(read_chat_rows(path))


def test_a_line_over_the_cap_is_refused_with_its_size_and_the_next_line_keeps_its_number(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    long_row = chat_row_line(ChatRow.from_columns(None, "x" * 5000, "y"))
    path.write_text(chat_row_line(ChatRow.from_columns(None, "q", "a")) + long_row, encoding="utf-8")
    size = len(long_row.encode())
    with pytest.raises(ChatRowError, match=rf"big.jsonl:2: line of {size:,} bytes is over the 1,000-byte limit"):
        list(read_chat_rows(path, max_line_bytes=1000))
    assert [n for n, _, _ in read_chat_rows(path, max_line_bytes=size)] == [1, 2]


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ChatRowError, match="nothing.jsonl: file not found"):
        list(read_chat_rows(tmp_path / "nothing.jsonl"))
