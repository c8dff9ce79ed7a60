"""Fit a conversation into a token limit by shortening its context, never its final assistant answer.

Long-context QA rows (a report table, paragraphs, then the question) are mostly context; cutting from
the end would remove the answer. Here, in order, until the rendered conversation fits:

1. drop the earliest turns of a multi-turn conversation (the system prompt and the final question stay);
2. cut the middle out of the longest context message (system or user), keeping its start (the
   instruction) and its end (the question), with MARKER where text was removed.

A row whose answer alone does not fit is not shortened: `fit_context` returns None and the caller drops it.
"""

from __future__ import annotations

from typing import Any

from workloads.common.chat_template import render

Messages = list[dict[str, str]]

MARKER = "\n[...]\n"
MAX_ROUNDS = 8


def final_answer(messages: Messages) -> int:
    """Index of the last assistant turn (the answer that is trained on and evaluated against)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index]["role"] == "assistant":
            return index
    return -1


def cap_context(messages: Messages, max_chars: int) -> Messages | None:
    """The conversation up to its final answer, each context message longer than `max_chars` reduced to its
    first and last `max_chars // 2` characters (more than max_length tokens are left either way, so the
    token-level fit decides the rest); None when the answer alone is longer than `max_chars`."""
    last = final_answer(messages)
    if last < 0:
        return messages
    if len(messages[last]["content"]) > max_chars:
        return None
    half = max_chars // 2
    return [m if i == last or len(m["content"]) <= max_chars
            else {**m, "content": m["content"][:half] + MARKER + m["content"][-half:]}
            for i, m in enumerate(messages[: last + 1])]


def token_count(tokenizer: Any, messages: Messages) -> int:
    text = render(tokenizer, messages)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _drop_earliest_turn(messages: Messages) -> Messages | None:
    """Without the first user turn and its replies, or None when only the final question is left."""
    last = len(messages) - 1
    users = [i for i, m in enumerate(messages[:last]) if m["role"] == "user"]
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), last)
    if len(users) < 2 or first >= users[-1]:
        return None
    following = next(i for i in users if i > first)
    return messages[:first] + messages[following:]


def cut_middle(tokenizer: Any, content: str, remove: int) -> str:
    """`content` less about `remove` tokens from its middle (plus the marker's), start and end kept."""
    offsets = tokenizer(content, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    keep = len(offsets) - remove - len(tokenizer(MARKER, add_special_tokens=False)["input_ids"])
    if keep <= 0:
        return ""
    head = (keep + 1) // 2
    tail = keep - head
    return content[: offsets[head - 1][1]] + MARKER + (content[offsets[len(offsets) - tail][0]:] if tail else "")


def fit_context(tokenizer: Any, messages: Messages, max_length: int) -> Messages | None:
    """`messages` (ending with the final answer) shortened to at most `max_length` tokens as rendered by
    the chat template, answer untouched; None when even an empty context leaves no room for the answer."""
    messages = list(messages)
    count = token_count(tokenizer, messages)
    while count > max_length:
        shorter = _drop_earliest_turn(messages)
        if shorter is None:
            break
        messages, count = shorter, token_count(tokenizer, shorter)
    last = len(messages) - 1
    for _ in range(MAX_ROUNDS):
        if count <= max_length:
            return messages
        context = [i for i in range(last) if messages[i]["content"]]
        if not context:
            return None
        longest = max(context, key=lambda i: len(messages[i]["content"]))
        cut = cut_middle(tokenizer, messages[longest]["content"], count - max_length)
        messages[longest] = {**messages[longest], "content": cut}
        count = token_count(tokenizer, messages)
    return messages if count <= max_length else None
