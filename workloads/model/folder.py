"""Read facts about a saved model folder without loading its weights."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from safetensors import safe_open

from workloads.common.chat_template import load_chat_tokenizer


class ModelFolderError(ValueError):
    """A model folder that is not a usable safetensors model with tokenizer and chat template."""


def weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFolderError(f"{folder}: no *.safetensors weight files")
    return files


def weight_stats(files: list[Path]) -> tuple[int, str]:
    """Parameter count and dominant dtype, from the safetensors headers only."""
    count = 0
    bytes_by_dtype: Counter[str] = Counter()
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    tensor = handle.get_slice(key)
                    numel = 1
                    for dim in tensor.get_shape():
                        numel *= dim
                    count += numel
                    bytes_by_dtype[tensor.get_dtype()] += numel
        except Exception as error:  # safetensors raises its own error types for corrupt headers
            raise ModelFolderError(f"{file}: unreadable safetensors file: {error}") from None
    dtype = bytes_by_dtype.most_common(1)[0][0] if bytes_by_dtype else "unknown"
    return count, dtype


def check_tokenizer(folder: Path) -> None:
    """The folder's tokenizer loads and carries a chat template."""
    load_chat_tokenizer(folder, ModelFolderError)
