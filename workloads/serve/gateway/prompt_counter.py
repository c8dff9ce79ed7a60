"""The gateway's count of a conversation's prompt tokens, with the served model's own tokenizer and chat template
(what a request's token budget, workloads.serve.token_budget, is checked against before an engine sees it)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from workloads.common.chat_template import prompt_ids


class PromptCounter:
    """Counts a conversation's prompt tokens with the served model's tokenizer and chat template."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self.folder)
            return self._tokenizer

    def count(self, messages: list[dict[str, str]]) -> int:
        return len(prompt_ids(self._load(), messages))

    def vocabulary(self) -> int:
        """How many token ids the tokenizer decodes (its vocabulary with the added tokens)."""
        return len(self._load())
