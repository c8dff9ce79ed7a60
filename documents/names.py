"""Names that become parts of paths and keys: stack names and run ids follow Pulumi's rule for stack names."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

NAME_RULE = "letters, digits, '-', '_' and '.' only, not '.' or '..'"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def checked_name(value: str, what: str = "name") -> str:
    """`value` when it is a safe stack name or run id, else a ValueError quoting it and the rule."""
    if not _NAME.fullmatch(value) or value in (".", ".."):
        raise ValueError(f"{what} {value!r}: use {NAME_RULE}")
    return value


StackName = Annotated[str, AfterValidator(lambda value: checked_name(value, "stack name"))]
RunId = Annotated[str, AfterValidator(lambda value: checked_name(value, "run id"))]
