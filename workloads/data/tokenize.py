"""Tokenize chat JSONL with the model's chat template into a `datasets` folder for assistant-only training.

    python -m workloads.data.tokenize --input conversations_train.jsonl --model model/base --max-length 512 \
        --out tokenized/train [--num-proc 2] [--overlong context|truncate|drop] [--max-lost-fraction 0.05]

Columns: input_ids, attention_mask, labels, length, prompt_length (tokens before the final answer: the
generation prompt the evaluator uses) and row (line of the input, counted from 0, non-empty lines only).
Labels are -100 except the assistant's tokens, which include the end-of-turn token (the tokenizer's eos token, <|im_end|> for ChatML models).
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from documents.atomic import atomic_dir, os_errors_as
from documents.chat_row import ChatRowError, read_chat_rows
from documents.prepare_summary import TokenizeLosses
from documents.stage_manifest import MANIFEST_NAME, StageManifest, read_stage_manifest, write_manifest
from workloads.common.chat_template import load_chat_tokenizer, render
from workloads.data.freshness import build_manifest, is_current
from workloads.data.shorten import Messages, cap_context, fit_context, token_count

log = logging.getLogger("workloads.data.tokenize")

IGNORE = -100
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
Overlong = Literal["context", "truncate", "drop"]
OVERLONG = ("context", "truncate", "drop")
DROPPED = ("dropped_overlong", "dropped_answer_too_long", "dropped_no_assistant_tokens")


class TokenizeError(ValueError):
    """Input or model that cannot be tokenized; the message names the file, line or template problem."""


def read_conversations(path: Path) -> list[list[dict[str, str]]]:
    """The `messages` of each chat row (documents.chat_row checks them: {role, content} strings)."""
    try:
        conversations = [row.turns() for _, _, row in read_chat_rows(path)]
    except ChatRowError as error:
        raise TokenizeError(str(error)) from None
    if not conversations:
        raise TokenizeError(f"{path}: no rows")
    return conversations


def assistant_spans(tokenizer: Any, messages: list[dict[str, str]], text: str) -> list[tuple[int, int]]:
    """Character spans of `text` (the rendered conversation) that the model must learn: each assistant
    reply from the end of the generation prompt up to and including the end-of-turn token."""
    eot = tokenizer.eos_token
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = render(tokenizer, messages[:index], generation_prompt=True) if index else ""
        if not text.startswith(prefix):
            raise TokenizeError("chat template renders earlier turns differently once a reply follows; "
                                "cannot locate assistant tokens")
        content = message["content"].strip()
        start = text.find(content, len(prefix))
        end = text.find(eot, start + len(content)) if start >= 0 else -1
        if end < 0:
            raise TokenizeError(f"cannot find assistant turn {index} followed by {eot!r} in the rendered template")
        spans.append((len(prefix), end + len(eot)))
    return spans


def label_spans(ids: list[int], offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Labels: each token overlapping a character span keeps its id, every other token is IGNORE."""
    labels = [IGNORE] * len(ids)
    ends = [end for _, end in offsets]
    for start, stop in spans:
        index = bisect.bisect_right(ends, start)
        while index < len(ids) and offsets[index][0] < stop:
            labels[index] = ids[index]
            index += 1
    return labels


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token can stand for: its vocabulary string's length (byte-level and
    sentencepiece vocabularies spell each byte or space as one character)."""
    return max(1, *(len(token) for token in tokenizer.get_vocab()))


def cap_messages(messages: list[dict[str, str]], max_chars: int) -> tuple[list[dict[str, str]], bool]:
    """The conversation cut after its first `max_chars` characters of content, and whether it was cut.
    With `max_chars` = max_length x the longest token, text past the cut cannot be among the first
    max_length tokens, so one enormous row is never tokenized (or rendered) whole."""
    kept, left = [], max_chars
    for message in messages:
        if len(message["content"]) > left:
            return kept + ([{**message, "content": message["content"][:left]}] if left else []), True
        kept.append(message)
        left -= len(message["content"])
    return kept, False


def _encode(tokenizer: Any, conversations: list[Messages]) -> list[tuple[list[int], list[int], int]]:
    """(input_ids, labels, prompt_length) per conversation; prompt_length is where the final answer starts.
    The text up to the final answer and the rest are tokenized apart, so that the prompt's tokens are the ones
    evaluation and serving feed (workloads.common.chat_template.prompt_ids): tokenized whole, a prompt ending in
    whitespace (Qwen3's empty think block) would merge differently with the answer after it."""
    texts = [render(tokenizer, m) for m in conversations]
    spans = [assistant_spans(tokenizer, m, text) for m, text in zip(conversations, texts)]
    cuts = [found[-1][0] if found else len(text) for found, text in zip(spans, texts)]
    heads = tokenizer([t[:c] for t, c in zip(texts, cuts)], add_special_tokens=False, return_offsets_mapping=True)
    tails = tokenizer([t[c:] for t, c in zip(texts, cuts)], add_special_tokens=False, return_offsets_mapping=True)
    rows = []
    for found, cut, head, head_offsets, tail, tail_offsets in zip(
            spans, cuts, heads["input_ids"], heads["offset_mapping"], tails["input_ids"], tails["offset_mapping"]):
        ids = [*head, *tail]
        offsets = [*head_offsets, *((start + cut, end + cut) for start, end in tail_offsets)]
        rows.append((ids, label_spans(ids, offsets, found), len(head)))
    return rows


def _shortened(tokenizer: Any, messages: list[Messages], max_length: int, max_chars: int
               ) -> list[tuple[Messages | None, bool]]:
    """`context` mode: each conversation fitted to max_length (None: its answer alone is too long) and
    whether its context was shortened."""
    capped = [cap_context(m, max_chars) for m in messages]
    fitted = []
    for original, conversation in zip(messages, capped):
        if conversation is None:
            fitted.append((None, True))
        elif token_count(tokenizer, conversation) > max_length:
            fitted.append((fit_context(tokenizer, conversation, max_length), True))
        else:
            fitted.append((conversation, conversation != original))
    return fitted


def encode_batch(
    batch: dict[str, list[Any]], indices: list[int], tokenizer: Any, max_length: int, overlong: Overlong,
    max_chars: int,
) -> dict[str, list[Any]]:
    """Tokenize a batch of conversations; `status` says kept, truncated or why a row is dropped."""
    if overlong == "context":
        fitted = _shortened(tokenizer, batch["messages"], max_length, max_chars)
    else:
        fitted = [(m, cut) for m, cut in (cap_messages(m, max_chars) for m in batch["messages"])]
    encoded = iter(_encode(tokenizer, [m for m, _ in fitted if m is not None]))
    out: dict[str, list[Any]] = {key: [] for key in ("input_ids", "attention_mask", "labels", "length",
                                                     "prompt_length", "row", "status")}
    for index, (messages, cut) in zip(indices, fitted):
        ids, labels, start = next(encoded) if messages is not None else ([], [], 0)
        status = "truncated" if cut else "kept"
        if messages is None:
            status = "dropped_answer_too_long"
        elif len(ids) > max_length:
            status = "dropped_overlong" if overlong == "drop" else "truncated"
            ids, labels = ids[:max_length], labels[:max_length]
        if status not in DROPPED and all(label == IGNORE for label in labels):
            status = "dropped_no_assistant_tokens"
        out["input_ids"].append(ids)
        out["attention_mask"].append([1] * len(ids))
        out["labels"].append(labels)
        out["length"].append(len(ids))
        out["prompt_length"].append(min(start, len(ids)))
        out["row"].append(index)
        out["status"].append(status)
    return out


def load_tokenizer(model: Path) -> Any:
    if not model.is_dir():
        raise TokenizeError(f"{model}: model folder not found")
    tokenizer = load_chat_tokenizer(model, TokenizeError)
    if not tokenizer.is_fast:
        raise TokenizeError(f"{model}: needs a fast tokenizer (offsets locate the assistant tokens)")
    if not tokenizer.eos_token:
        raise TokenizeError(f"{model}: tokenizer has no eos (end-of-turn) token")
    return tokenizer


def loss_summary(manifest: StageManifest) -> dict[str, Any]:
    """What a stage summary shows of a tokenize manifest: rows read, kept, truncated, dropped by reason."""
    return {"rows_read": manifest.rows_read, "rows_kept": manifest.rows_written, "truncated": manifest.truncated,
            "dropped": {reason.removeprefix("dropped_"): getattr(manifest, reason) for reason in DROPPED},
            "lost_fraction": manifest.lost_fraction}


def tokenize_losses(manifest: StageManifest) -> TokenizeLosses:
    """The loss summary with the split's mean tokens per row, as the prepare and evaluator summaries carry it."""
    return TokenizeLosses.model_validate({**loss_summary(manifest), "mean_tokens": manifest.mean_tokens})


def check_losses(input_path: Path, counts: Counter, rows: int, overlong: str, max_length: int,
                 max_lost_fraction: float) -> None:
    """Fail when more than `max_lost_fraction` of the rows were dropped, naming the causes and the settings."""
    lost = sum(counts[reason] for reason in DROPPED)
    if lost <= max_lost_fraction * rows:
        return
    causes = ", ".join(f"{counts[r]} {r.removeprefix('dropped_').replace('_', ' ')}" for r in DROPPED if counts[r])
    fixes = {"dropped_overlong": "overlong: context",
             "dropped_no_assistant_tokens": "overlong: context (cuts the context, not the answer)",
             "dropped_answer_too_long": f"a larger max_length (now {max_length})"}
    hint = "; ".join(dict.fromkeys(fixes[r] for r in DROPPED if counts[r]))
    raise TokenizeError(
        f"{input_path}: {lost} of {rows} rows ({lost / rows:.1%}) lost at max_length {max_length}, "
        f"overlong {overlong} ({causes}); more than data.max_lost_fraction {max_lost_fraction} "
        f"(--max-lost-fraction). Fix: {hint}, or raise max_lost_fraction to accept the loss")


def tokenize(
    input_path: str | Path,
    model: str | Path,
    max_length: int,
    out: str | Path,
    overlong: Overlong = "context",
    num_proc: int = 1,
    batch_size: int = 256,
    max_lost_fraction: float = 1.0,
) -> StageManifest:
    """Tokenize `input_path` into the `datasets` folder `out` (atomic, manifest inside); no-op if current.
    Fails, writing nothing, when more than `max_lost_fraction` of the rows would be dropped."""
    with os_errors_as(TokenizeError, out):
        return _tokenize(Path(input_path), Path(model), max_length, Path(out), overlong, num_proc, batch_size,
                         max_lost_fraction)


def _tokenize(input_path: Path, model: Path, max_length: int, out: Path, overlong: Overlong, num_proc: int,
              batch_size: int, max_lost_fraction: float) -> StageManifest:
    from datasets import Dataset, disable_caching

    if max_length < 1:
        raise TokenizeError(f"max_length must be positive, got {max_length}")
    if overlong not in OVERLONG:
        raise TokenizeError(f"overlong must be one of {', '.join(OVERLONG)}, got {overlong!r}")
    if not 0.0 <= max_lost_fraction <= 1.0:
        raise TokenizeError(f"max_lost_fraction must be between 0 and 1, got {max_lost_fraction}")
    inputs = {"input": input_path, **{name: model / name for name in TOKENIZER_FILES if (model / name).is_file()}}
    params = {"max_length": max_length, "overlong": overlong, "max_lost_fraction": max_lost_fraction}
    if input_path.is_file() and is_current(out, "tokenize", inputs, params):
        log.info("%s is up to date", out)
        return read_stage_manifest((out / MANIFEST_NAME).read_bytes(), str(out / MANIFEST_NAME))
    tokenizer = load_tokenizer(model)
    conversations = read_conversations(input_path)
    disable_caching()
    dataset = Dataset.from_dict({"messages": conversations})
    mapped = dataset.map(
        encode_batch,
        batched=True,
        with_indices=True,
        batch_size=batch_size,
        num_proc=num_proc if num_proc > 1 and len(dataset) >= 2 * batch_size else None,
        remove_columns=["messages"],
        fn_kwargs={"tokenizer": tokenizer, "max_length": max_length, "overlong": overlong,
                   "max_chars": max_length * max_token_chars(tokenizer)},
        desc=f"tokenize {input_path.name}",
    )
    counts = Counter(mapped["status"])
    check_losses(input_path, counts, len(dataset), overlong, max_length, max_lost_fraction)
    kept = mapped.filter(lambda s: [x in ("kept", "truncated") for x in s], input_columns="status", batched=True)
    kept = kept.remove_columns("status")
    if len(kept) == 0:
        raise TokenizeError(f"{input_path}: every row was dropped ({dict(counts)})")
    lengths = kept["length"]
    stats = {
        "rows_read": len(dataset),
        "rows_written": len(kept),
        "truncated": counts["truncated"],
        **{reason: counts[reason] for reason in DROPPED},
        "lost_fraction": round(sum(counts[r] for r in DROPPED) / len(dataset), 4),
        "tokens": sum(lengths),
        "max_tokens": max(lengths),
        "mean_tokens": round(sum(lengths) / len(lengths), 1),
    }
    with atomic_dir(out) as tmp:
        kept.save_to_disk(str(tmp))
        manifest = build_manifest("tokenize", inputs, params, model=str(model.resolve()), **stats)
        write_manifest(tmp / MANIFEST_NAME, manifest)
    log.info("wrote %d of %d rows to %s (%d truncated (%s), dropped: %s)", len(kept), len(dataset), out,
             stats["truncated"], overlong, loss_summary(manifest)["dropped"])
    return manifest


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workloads.data.tokenize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="chat .jsonl file")
    parser.add_argument("--model", required=True, help="model folder with tokenizer and chat template")
    parser.add_argument("--max-length", type=int, required=True, help="token limit per conversation")
    parser.add_argument("--out", required=True, help="output datasets folder")
    parser.add_argument("--overlong", choices=OVERLONG, default="context",
                        help="rows over the limit: context (shorten the context, keep the answer), truncate "
                             "(cut the end), drop")
    parser.add_argument("--max-lost-fraction", type=float, default=1.0,
                        help="fail when more than this share of rows is dropped (default 1: never)")
    parser.add_argument("--num-proc", type=int, default=1, help="CPU processes")
    parser.add_argument("--batch-size", type=int, default=256, help="conversations per map batch")
    args = parser.parse_args(argv)
    try:
        manifest = tokenize(args.input, args.model, args.max_length, args.out, args.overlong, args.num_proc,
                            args.batch_size, args.max_lost_fraction)
    except TokenizeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"output": str(Path(args.out).resolve()), **loss_summary(manifest)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
