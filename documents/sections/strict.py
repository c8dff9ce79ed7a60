"""Strict fields for run configs. Scalars: JSON `true` is not the count 1, `2.5` is not a count, `"3"` is no number,
`1` is no flag (pydantic's lax mode takes all four); a number still takes an integer. Run paths: normalised
(`a/./b/../c` is `a/c`), and a relative one stays under the run root it resolves against (`../../etc` is refused;
an absolute path is the writer's explicit choice)."""

from __future__ import annotations

import posixpath
from typing import Annotated

from pydantic import AfterValidator, Strict

Count = Annotated[int, Strict()]
Number = Annotated[float, Strict()]
Flag = Annotated[bool, Strict()]


def inside_root(value: str) -> str:
    """`value` normalised; refused when empty, holding a control character, or relative and leaving the root."""
    if not value.strip():
        raise ValueError("must not be empty")
    if any(ord(c) < 32 for c in value):
        raise ValueError(f"must not hold a control character (newline, tab, NUL): {value!r}")
    path = posixpath.normpath(value)
    if path == ".." or path.startswith("../"):
        raise ValueError(f"{value!r} leaves the run root ({path!r} from it): give a path under the run root, or an "
                         "absolute path")
    return path


RunPath = Annotated[str, AfterValidator(inside_root)]
