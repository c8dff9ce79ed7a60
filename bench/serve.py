"""Serving benchmark: base against fine-tuned, at concurrency 1 and 16, through the real endpoint.

Starts the server itself (python -m workloads.serve.launch) twice in one run:
  1. merged:       base + merged fine-tuned model, each in `transformers serve` with continuous batching;
  2. adapter-4bit: the base loaded in 4-bit NF4 with the LoRA adapter left unmerged (the seed's setup).
For every model and concurrency it streams the same test prompts and prints one JSON document:
time to first token, time per output token and output tokens/s per request (median, p90), aggregate output
tokens/s, the fine-tuned/base throughput ratio per concurrency (target >= 0.95) and batched/single ratios.

    .venv/bin/python bench/serve.py --config workloads/configs/local.json [--max-tokens 32] [--paths merged adapter-4bit]
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds tokenize.py, which would shadow the standard library module of that name.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from documents.run_config import load_run_config  # noqa: E402
from workloads.eval.generation import read_prompts  # noqa: E402
from workloads.eval.perplexity import load_tokenized  # noqa: E402
from workloads.serve.client import stream_chat  # noqa: E402
from workloads.serve.process import start_launcher, stop_launcher  # noqa: E402

TARGET_RATIO = 0.95


def start(config: Path, finetuned: str, with_base: bool, log: Path, timeout_s: float) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "FT_API_KEY"}
    args = ["--finetuned", finetuned, *([] if with_base else ["--no-base"])]
    proc, url = start_launcher(config, args, env, log, timeout_s, cwd=ROOT)
    return proc, f"{url}/v1"


def one_request(api: str, model: str, messages: list[dict], max_tokens: int, tokenizer) -> dict[str, float]:
    final = None
    for final in stream_chat(api, model, messages, max_tokens=max_tokens):
        pass
    assert final is not None and final.total_s is not None
    tokens = max(len(tokenizer(final.text, add_special_tokens=False)["input_ids"]), final.chunks)
    ttft = final.ttft_s if final.ttft_s is not None else final.total_s
    decode = final.total_s - ttft
    return {
        "ttft_s": ttft,
        "tpot_s": decode / (tokens - 1) if tokens > 1 else decode,
        "tokens_per_second": tokens / final.total_s if final.total_s > 0 else 0.0,
        "tokens": tokens,
    }


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, max(0, round(0.9 * len(ordered) + 0.5) - 1))]
    return {"median": statistics.median(ordered), "p90": p90}


def measure(api: str, model: str, prompts: list[list[dict]], concurrency: int, requests: int, max_tokens: int, tokenizer) -> dict:
    jobs = [prompts[i % len(prompts)] for i in range(requests)]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda m: one_request(api, model, m, max_tokens, tokenizer), jobs))
    wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    return {
        "requests": requests,
        "output_tokens": tokens,
        "wall_s": wall,
        "throughput_tokens_per_second": tokens / wall,
        "ttft_s": summary([r["ttft_s"] for r in results]),
        "tpot_s": summary([r["tpot_s"] for r in results]),
        "tokens_per_second": summary([r["tokens_per_second"] for r in results]),
    }


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "workloads" / "configs" / "local.json"))
    parser.add_argument("--paths", nargs="+", choices=("merged", "adapter-4bit"), default=["merged", "adapter-4bit"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--requests", type=int, default=16, help="requests per level (at least the concurrency)")
    parser.add_argument("--single-requests", type=int, default=4, help="requests at concurrency 1")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    run = load_run_config(args.config)
    tokenizer = AutoTokenizer.from_pretrained(run.base_model_dir)
    prompts = [[{"role": "user", "content": p.input}]
               for p in read_prompts(load_tokenized(run.test_tokenized_dir, 16), run.test_jsonl, 16)]
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    config = work / "run.json"
    config.write_text(run.model_dump_json())

    results: dict[str, dict] = {}
    for path in args.paths:
        with_base = "base" not in results
        proc, api = start(config, path, with_base, work / f"serve-{path}.log", args.startup_timeout)
        try:
            names = (["base"] if with_base else []) + ["finetuned"]
            for name in names:
                one_request(api, name, prompts[0], 4, tokenizer)
                key = "base" if name == "base" else f"finetuned_{path}"
                print(f"bench: {key}", file=sys.stderr, flush=True)
                results[key] = {
                    str(c): measure(api, name, prompts, c, max(c, args.single_requests if c == 1 else args.requests),
                                    args.max_tokens, tokenizer)
                    for c in args.concurrency
                }
        finally:
            stop_launcher(proc)

    levels = [str(c) for c in args.concurrency]
    report: dict = {"settings": {"max_tokens": args.max_tokens, "concurrency": args.concurrency,
                                 "requests": args.requests, "single_requests": args.single_requests,
                                 "engine": "transformers serve --continuous-batching", "device": (run.serve.device if run.serve else "auto"),
                                 "target_ratio": TARGET_RATIO},
                    "results": results, "ratios": {}}
    for key in [k for k in results if k != "base"]:
        entry: dict = {}
        for c in levels:
            r = ratio(results[key][c]["throughput_tokens_per_second"], results["base"][c]["throughput_tokens_per_second"])
            entry[f"finetuned_over_base_c{c}"] = r
            entry[f"meets_target_c{c}"] = r is not None and r >= TARGET_RATIO
        if len(levels) > 1:
            entry["batched_over_single_finetuned"] = ratio(results[key][levels[-1]]["throughput_tokens_per_second"],
                                                           results[key][levels[0]]["throughput_tokens_per_second"])
        report["ratios"][key] = entry
    if len(levels) > 1:
        report["ratios"]["batched_over_single_base"] = ratio(results["base"][levels[-1]]["throughput_tokens_per_second"],
                                                             results["base"][levels[0]]["throughput_tokens_per_second"])
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
