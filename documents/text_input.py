"""Text and JSON from outside the process (files, standard input, request bodies): decoded and parsed so that
hostile bytes or nesting end in a ValueError naming the origin, never a UnicodeDecodeError or RecursionError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_JSON_DEPTH = 64
"""arrays and objects one inside another; no document, config or request of this project comes near it."""


class TextInputError(ValueError):
    """Bytes that are not UTF-8, or JSON that is invalid or nested too deeply; the message names the origin."""


class JsonTooDeep(TextInputError):
    """JSON nested deeper than MAX_JSON_DEPTH."""


def utf8_text(data: bytes, origin: str) -> str:
    """`data` decoded as UTF-8, or an error naming `origin` and the byte offset of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TextInputError(f"{origin}: not UTF-8 text (byte {error.start}: {error.reason})") from None


def is_unicode(text: str) -> bool:
    """Whether `text` can be written as UTF-8: JSON's escapes allow a lone surrogate such as `\\ud800`, which no
    file, tokenizer or HTTP body can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_utf8(path: Path) -> str:
    """The UTF-8 text of the file at `path` (OSError when it cannot be read; TextInputError when not UTF-8)."""
    return utf8_text(Path(path).read_bytes(), str(path))


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in `value` (0 for a scalar), without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_JSON_DEPTH:
            pending.extend((child, depth + 1) for child in children)
    return deepest


def _not_json(constant: str) -> Any:
    raise TextInputError(f"{constant} is not JSON (RFC 8259 has no NaN or Infinity)")


def load_json(text: str | bytes, origin: str, *, standard: bool = False) -> Any:
    """`text` parsed as JSON, or a TextInputError naming `origin`: not UTF-8, not JSON, or nested deeper than
    MAX_JSON_DEPTH. `standard` also refuses NaN and Infinity, which Python's JSON writes and reads but JSON lacks."""
    if isinstance(text, bytes):
        text = utf8_text(text, origin)
    too_deep = f"{origin}: JSON nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        value = json.loads(text, parse_constant=_not_json) if standard else json.loads(text)
    except RecursionError:
        raise JsonTooDeep(too_deep) from None
    except json.JSONDecodeError as error:
        raise TextInputError(f"{origin}: not valid JSON: {error}") from None
    except TextInputError as error:
        raise TextInputError(f"{origin}: {error}") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise JsonTooDeep(too_deep)
    return value
