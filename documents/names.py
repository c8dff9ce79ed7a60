"""Names that become parts of paths and keys: stack names and run ids follow Pulumi's rule for stack names."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

MAX_NAME_LENGTH = 100
"""Pulumi's rule (pulumi/pulumi, sdk/go/common/tokens/stack_name.go, ParseStackName: empty and `len(s) > 100` are
refused, characters `[A-Za-z0-9_.-]`); '.' and '..' are refused here too, as paths. The bound also keeps
`Pulumi.<stack>.yaml` and `<stack>-outputs.json` under the 255-byte file name limit."""
NAME_RULE = f"letters, digits, '-', '_' and '.' only, not '.' or '..', at most {MAX_NAME_LENGTH} characters"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def checked_name(value: str, what: str = "name") -> str:
    """`value` when it is a safe stack name or run id, else a ValueError quoting it and the rule."""
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} {value[:40]!r}... ({len(value)} characters): use {NAME_RULE}")
    if not _NAME.fullmatch(value) or value in (".", ".."):
        raise ValueError(f"{what} {value!r}: use {NAME_RULE}")
    return value


StackName = Annotated[str, AfterValidator(lambda value: checked_name(value, "stack name"))]
RunId = Annotated[str, AfterValidator(lambda value: checked_name(value, "run id"))]
