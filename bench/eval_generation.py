"""Evaluator generation: one prompt at a time (the evaluator before batching) against batched generation
plus the timed runs, on the same prompts and model; prints JSON.

    .venv/bin/python bench/eval_generation.py --model .local/test-cache/smollm2-base --prompts 6 --max-new-tokens 48 \
        [--batch-size 16] [--max-length 512] [--device cpu|cuda]

Prompts are synthetic long-context QA rows fitted to --max-length as training does (overlong `context`: the
context shortened, workloads.data.shorten) and rendered with the generation prompt. `--random-weights`
builds the model from the folder's config.json with random weights (a GPU machine without the weights;
replies are then noise, which runs every prompt to max_new_tokens: the slowest case). Both arms generate greedily; `sequential` is the old loop (one generate call per prompt), `batched`
is workloads.eval.generation.generate_all (a one-token warm-up, `--timing-runs` prompts one at a time and
timed, the rest in batches), i.e. everything the evaluator now spends on generation per model.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds tokenize.py, which would shadow the standard library module of that name.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model folder (tokenizer with a chat template)")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--timing-runs", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--random-weights", action="store_true", help="config.json only, random weights")
    args = parser.parse_args()

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from workloads.common.chat_template import prompt_ids
    from workloads.data.finance_qa import qa_rows
    from workloads.data.shorten import fit_context
    from workloads.eval.generation import Prompt, generate_all, generate_batch

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = []
    for row in qa_rows(args.prompts, 0):
        messages = fit_context(tokenizer, [{"role": "user", "content": row["user"]},
                                           {"role": "assistant", "content": row["assistant"]}], args.max_length)
        prompts.append(Prompt(prompt_ids(tokenizer, messages[:-1]), "", ""))
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    if args.random_weights:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    model = model.to(args.device).eval()

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    generate_batch(model, tokenizer, prompts[:1], 4)
    sync()
    start = time.perf_counter()
    sequential = [generate_batch(model, tokenizer, [p], args.max_new_tokens)[0] for p in prompts]
    sync()
    sequential_s = time.perf_counter() - start

    batched, batched_s, timing = generate_all(model, tokenizer, prompts, args.max_new_tokens, args.batch_size,
                                              args.timing_runs, 0, "batched")
    sync()
    same = sum(a.text == b.text for a, b in zip(sequential, batched))
    print(json.dumps({
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size, "timing_runs": args.timing_runs,
        "mean_prompt_tokens": round(sum(len(p.ids) for p in prompts) / len(prompts), 1),
        "sequential_s": round(sequential_s, 2),
        "batched_with_timing_s": round(batched_s, 2),
        "speedup": round(sequential_s / batched_s, 2),
        "median_tokens_per_second": round(timing.tokens_per_second, 1),
        "median_time_to_first_token_s": round(timing.ttft_s, 4),
        "same_replies": f"{same}/{len(prompts)}",
    }))


if __name__ == "__main__":
    main()
