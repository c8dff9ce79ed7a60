"""The chat row: one line of chat JSONL, `{"messages": [{"role", "content"}, ...], <kept columns>}`, the file every
data stage hands to the next (convert writes it; split, tokenize and the evaluator's generation read it).

`read_chat_rows` streams a file's rows with their line numbers and raw text; a line that is not a chat row raises
`ChatRowError` naming the file and line. `chat_row_line` is the one way a row becomes a line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError

from documents.base import DocumentError
from documents.text_input import TextInputError, load_json, utf8_text

MAX_LINE_BYTES = 16 << 20
"""Longest chat row read (16 MiB): far above any real conversation, low enough that one bad line cannot exhaust
memory through the JSON parser."""


class ChatRowError(DocumentError):
    """A line is not a chat row; the message names the file and the line."""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    role: StrictStr
    content: StrictStr


class ChatRow(BaseModel):
    """A conversation, with the columns convert kept beside it (e.g. the document several questions are about)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    messages: list[ChatMessage]

    @classmethod
    def from_columns(cls, system: str | None, user: str, assistant: str, **kept: str) -> ChatRow:
        """A single-turn row from Finance-Instruct's columns (an empty system prompt is left out)."""
        turns = [{"role": "system", "content": system}] if (system or "").strip() else []
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        return cls.model_validate({"messages": turns, **kept})

    def turns(self) -> list[dict[str, str]]:
        """The messages as plain dicts, as chat templates take them."""
        return [{"role": m.role, "content": m.content} for m in self.messages]

    def kept(self, column: str) -> Any:
        """A column kept beside the messages, or None."""
        return (self.model_extra or {}).get(column)


def chat_row_line(row: ChatRow) -> str:
    """The row as one JSONL line, newline included."""
    return json.dumps(row.model_dump(mode="json"), ensure_ascii=False) + "\n"


def parse_chat_row(text: str, origin: str) -> ChatRow:
    """One line as a chat row, or a ChatRowError naming `origin` (file:line)."""
    try:
        value = load_json(text, origin)
    except TextInputError as error:
        raise ChatRowError(f"{origin}: not a JSON line ({str(error).removeprefix(f'{origin}: ')})") from None
    if not isinstance(value, dict) or "messages" not in value:
        raise ChatRowError(f"{origin}: expected an object with a 'messages' list")
    try:
        return ChatRow.model_validate(value)
    except ValidationError:
        raise ChatRowError(f"{origin}: messages must be a list of {{role, content}} strings") from None


def _lines(handle: Any, max_line_bytes: int) -> Iterator[tuple[int, bytes, int]]:
    """(line number, the line or its first max_line_bytes + 1 bytes, its full size), reading no more than that."""
    number = 0
    while raw := handle.readline(max_line_bytes + 1):
        number += 1
        size = len(raw)
        if size > max_line_bytes and not raw.endswith(b"\n"):
            for rest in iter(lambda: handle.readline(1 << 20), b""):
                size += len(rest)
                if rest.endswith(b"\n"):
                    break
        yield number, raw, size


def read_chat_rows(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str, ChatRow]]:
    """(line number, the line's text without its newline, the row) for each non-blank line of `path`, streamed."""
    if not path.is_file():
        raise ChatRowError(f"{path}: file not found")
    with open(path, "rb") as handle:
        for number, raw, size in _lines(handle, max_line_bytes):
            if size > max_line_bytes:
                raise ChatRowError(f"{path}:{number}: line of {size:,} bytes is over the {max_line_bytes:,}-byte "
                                   "limit of a chat row")
            if not raw.strip():
                continue
            origin = f"{path}:{number}"
            try:
                text = utf8_text(raw, origin).strip()
            except TextInputError as error:
                raise ChatRowError(f"{origin}: not a JSON line ({str(error).removeprefix(f'{origin}: ')})") from None
            yield number, text, parse_chat_row(text, origin)
