"""One rendering of a conversation for every stage: training's text and labels (workloads.data.tokenize), so
evaluation's prompts (the tokenized test split up to the answer), the serving engine's prompts and the gateway's
prompt budget. Where the tokenizer's chat template has a thinking switch (Qwen3's `enable_thinking`; `thinking`
in DeepSeek-V3.1's and Granite's), it is off: the fine-tune answers directly (seed 000), and the template puts
the empty think block in the prompt, not in the reply."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

SWITCHES = {"enable_thinking": False, "thinking": False}
"""template variables that turn reasoning on, and the value every stage renders with."""


def load_chat_tokenizer(folder: Path, error: type[Exception]) -> Any:
    """The tokenizer saved in a model folder, which must load and carry a chat template (`error` naming the folder
    and what is wrong): the one load both the model's preparation and tokenization make."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as problem:
        raise error(f"{folder}: tokenizer does not load: {problem}") from None
    if not tokenizer.chat_template:
        raise error(f"{folder}: tokenizer has no chat template")
    return tokenizer


def template_options(tokenizer: Any) -> dict[str, bool]:
    """The switches the tokenizer's chat template reads, at their SWITCHES value (none for other templates)."""
    template = tokenizer.chat_template
    text = template if isinstance(template, str) else json.dumps(template)
    return {name: value for name, value in SWITCHES.items() if re.search(rf"\b{name}\b", text)}


def folder_options(folder: Path) -> dict[str, bool]:
    """template_options of the tokenizer saved in a model folder: what an engine that renders prompts itself
    (vLLM, `transformers serve`) must be told to render as training did. A folder without a tokenizer has no
    template to switch (an engine cannot serve it and says so itself)."""
    from transformers import AutoTokenizer

    if not (folder / "tokenizer_config.json").is_file():
        return {}
    return template_options(AutoTokenizer.from_pretrained(folder))


def render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool = False) -> str:
    """The conversation as the model reads it; with `generation_prompt`, followed by the assistant's opening."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                         **template_options(tokenizer))


def prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of the prompt for the next reply, tokenized as training tokenizes its text."""
    return tokenizer(render(tokenizer, messages, generation_prompt=True), add_special_tokens=False)["input_ids"]
