"""Hugging Face's own files in a model or adapter folder, each with one reader: a model's `config.json` (the decoder
shape the memory estimate, the trainer and the serving budget need) and PEFT's `adapter_config.json`.

Both are third-party formats with many more keys than this project reads: the models keep the keys they name and
let the rest through unchanged, so an adapter config written back is the one read, with only what was changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from documents.atomic import write_text_atomic
from documents.base import DocumentError, describe
from documents.sections.train import LoraSettings
from documents.text_input import TextInputError, load_json

MODEL_CONFIG = "config.json"
ADAPTER_CONFIG = "adapter_config.json"


class DecoderConfig(BaseModel):
    """The text decoder's part of a model's config.json (the `text_config` of a multimodal model)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model_type: str = ""
    hidden_size: int | None = Field(None, gt=0)
    num_hidden_layers: int | None = Field(None, gt=0)
    num_attention_heads: int | None = Field(None, gt=0)
    num_key_value_heads: int | None = Field(None, gt=0)
    head_dim: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)
    vocab_size: int | None = Field(None, gt=0)
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None


class AdapterConfig(BaseModel):
    """PEFT's adapter_config.json: the keys this project reads; every other key is kept as it was."""

    model_config = ConfigDict(extra="allow", frozen=True)

    peft_type: str | None = None
    r: int = Field(LoraSettings.model_fields["r"].default, ge=1,
                   description="the adapter's rank; the one default rank (LoraSettings') where the file states none")
    lora_alpha: float | None = None
    base_model_name_or_path: str | None = None
    target_modules: list[str] | str | None = None


def _read_json_object(path: Path, what: str) -> dict[str, Any]:
    try:
        value = load_json(path.read_bytes(), str(path))
    except OSError as error:
        raise DocumentError(f"{path}: cannot read the {what}: {error.strerror or error}") from None
    except TextInputError as error:
        raise DocumentError(f"{path}: not a valid {what} ({str(error).removeprefix(f'{path}: ')})") from None
    if not isinstance(value, dict):
        raise DocumentError(f"{path}: not a valid {what} (a JSON object expected)")
    return value


def decoder_config(value: dict[str, Any], origin: str) -> DecoderConfig:
    """The decoder part of a parsed config.json (its `text_config` when it has one)."""
    section = value.get("text_config") if isinstance(value.get("text_config"), dict) else value
    try:
        return DecoderConfig.model_validate({"model_type": value.get("model_type", ""), **section})
    except ValidationError as error:
        raise DocumentError(f"{origin}: not a valid model config ({describe(error)})") from None


def read_decoder_config(folder: Path) -> DecoderConfig:
    """The decoder part of `folder`'s config.json, or a DocumentError naming the file and the field."""
    path = folder / MODEL_CONFIG
    return decoder_config(_read_json_object(path, "model config"), str(path))


def read_adapter_config(folder: Path) -> AdapterConfig:
    """`folder`'s adapter_config.json, or a DocumentError naming the file and the field."""
    path = folder / ADAPTER_CONFIG
    try:
        return AdapterConfig.model_validate(_read_json_object(path, "adapter config"))
    except ValidationError as error:
        raise DocumentError(f"{path}: not a valid adapter config ({describe(error)})") from None


def write_adapter_config(folder: Path, config: AdapterConfig) -> None:
    """Write `config` as `folder`'s adapter_config.json (atomic), every key it was read with included."""
    write_text_atomic(folder / ADAPTER_CONFIG, json.dumps(config.model_dump(mode="json", exclude_unset=True),
                                                          indent=2))
