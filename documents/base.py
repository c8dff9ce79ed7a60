"""What every document module shares: the error that names a document's origin and field, and strict parsing."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from documents.text_input import TextInputError, utf8_text

Document = TypeVar("Document", bound=BaseModel)


class DocumentError(ValueError):
    """A document is not what its model says; the message names the origin and the field or line."""


class Figures(BaseModel):
    """A document of measured figures: NaN and infinity are refused where a figure is required, and read as not
    measured (None) where it is optional, as files written before this rule hold them."""

    model_config = ConfigDict(allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _non_finite_is_not_measured(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        required = _required_fields(cls)
        return {key: None if key not in required and isinstance(value, float) and not math.isfinite(value) else value
                for key, value in data.items()}


@functools.cache
def _required_fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for name, field in model.model_fields.items() if field.is_required())


def describe(error: ValidationError) -> str:
    """'field.sub: message; ...' for every field at fault."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}" for e in error.errors())


def parse(model: type[Document], text: str | bytes, origin: str, what: str) -> Document:
    """`text` as a `model`, or a DocumentError naming `origin` and each bad field (or the first byte that is not
    UTF-8)."""
    try:
        return model.model_validate_json(utf8_text(text, origin) if isinstance(text, bytes) else text)
    except TextInputError as error:
        raise DocumentError(str(error)) from None
    except ValidationError as error:
        raise DocumentError(f"{origin}: not a valid {what} ({describe(error)})") from None


def read_document(model: type[Document], path: Path, what: str) -> Document:
    """The file at `path` as a `model`, or a DocumentError naming the file and why (unreadable, or each bad field)."""
    try:
        text = path.read_bytes()
    except OSError as error:
        raise DocumentError(f"{path}: cannot read the {what}: {error.strerror or error}") from None
    return parse(model, text, str(path), what)
