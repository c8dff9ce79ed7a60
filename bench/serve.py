"""Serving benchmark: base against fine-tuned, at concurrency 1 and 16, through the real endpoint.

Starts the server itself (python -m workloads.serve.launcher.launch) for each path:
  1. merged:       base + merged fine-tuned model, each in `transformers serve` with continuous batching;
  2. adapter-4bit: the base loaded in 4-bit NF4 with the LoRA adapter left unmerged (the seed's setup);
  3. adapters:     one peft engine with the base and N adapters (distinct random LoRA weights registered as
                   stored runs): resident memory against the base alone and against a `transformers serve`
                   process per fine-tune (merged copies; target <= 1.25x the base alone), then the clients
                   spread over base and adapters against the same clients all on base (tokens/s per name), against
                   one merged fine-tune in `transformers serve`, and (--vllm-python) against the same base,
                   adapters and clients in vLLM's CPU build.
For every model and concurrency it streams the same test prompts and prints one JSON document:
time to first token, time per output token and output tokens/s per request (median, p90), aggregate output
tokens/s, the fine-tuned/base throughput ratio per concurrency (target >= 0.95) and batched/single ratios.
Every request asks for `ignore_eos` (vLLM's serving benchmark does the same), so every side generates
--max-tokens tokens per request (the endpoint's own count, checked: `equal_output_tokens`) and a short answer
does not make fixed costs weigh more on one side; --no-ignore-eos measures natural lengths instead. The
machine's load average at the start and the end is part of the document: figures taken under load are not
comparable.

    .venv/bin/python bench/serve.py --config workloads/configs/local.json [--max-tokens 32] [--paths merged adapter-4bit adapters]
    .venv/bin/python bench/serve.py --paths adapters --base DIR --clients 4 --requests 4 --max-tokens 8   # smallest
    .venv/bin/python bench/serve.py --paths adapters --vllm-python .venv-vllm/bin/python   # the three engines
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "tests"))  # adapter_runs (stored-run adapters), serve_process: shared with the tests

from adapter_runs import STACK, register_run, save_adapter  # noqa: E402
from serve_process import free_port, start_launcher, stop_launcher  # noqa: E402

from documents.run_config import RunConfig, load_run_config, parse_run_config  # noqa: E402
from infra.runs.store import LocalStore  # noqa: E402
from workloads.eval.generation import read_prompts  # noqa: E402
from workloads.eval.perplexity import load_tokenized  # noqa: E402
from workloads.serve.clients.openai_client import stream_chat  # noqa: E402

TARGET_RATIO = 0.95
MEMORY_TARGET = 1.25
"""base + adapters in one server over the base alone (resident memory)"""
FIXED_PROMPTS = ["What is a bond?", "Summarise a quarterly earnings report in two lines.",
                 "What does a credit memo say about a borrower?", "Explain EBITDA to a new analyst.",
                 "What is in an annual filing?", "Why do interest rates move bond prices?"]


def start(config: Path, finetuned: str, with_base: bool, log: Path, timeout_s: float) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "FT_API_KEY"}
    args = ["--finetuned", finetuned, *([] if with_base else ["--no-base"])]
    proc, url = start_launcher(config, args, env, log, timeout_s, cwd=ROOT)
    return proc, f"{url}/v1"


IGNORE_EOS = True
"""set from --ignore-eos: every request generates max_tokens tokens"""
ISSUE_40_GOAL = 0.9
"""base + adapters in one peft engine over the merged model in transformers serve, at --clients, TTFT no worse"""


def load_average() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def one_request(api: str, model: str, messages: list[dict], max_tokens: int, tokenizer) -> dict[str, float]:
    final = None
    for final in stream_chat(api, model, messages, max_tokens=max_tokens, ignore_eos=IGNORE_EOS):
        pass
    assert final is not None and final.total_s is not None
    counted = max(len(tokenizer(final.text, add_special_tokens=False)["input_ids"]), final.chunks)
    tokens = final.completion_tokens if final.completion_tokens is not None else counted
    ttft = final.ttft_s if final.ttft_s is not None else final.total_s
    decode = final.total_s - ttft
    return {
        "ttft_s": ttft,
        "tpot_s": decode / (tokens - 1) if tokens > 1 else decode,
        "tokens_per_second": tokens / final.total_s if final.total_s > 0 else 0.0,
        "tokens": tokens,
    }


def equal_tokens(results: list[dict], max_tokens: int) -> bool:
    """Whether every request generated exactly `max_tokens` tokens (what --ignore-eos asks for)."""
    return all(r["tokens"] == max_tokens for r in results)


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
        "equal_output_tokens": equal_tokens(results, max_tokens),
        "wall_s": wall,
        "throughput_tokens_per_second": tokens / wall,
        "ttft_s": summary([r["ttft_s"] for r in results]),
        "tpot_s": summary([r["tpot_s"] for r in results]),
        "tokens_per_second": summary([r["tokens_per_second"] for r in results]),
    }


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and every descendant (VmRSS from /proc)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        todo += [int(c) for c in children]
    return total


def engine_rss(argv: list[str], url: str, model: str, log: Path, timeout_s: float) -> int:
    """Start one engine process, answer one request (weights and caches touched), return its resident memory."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"engine did not start; {log}:\n{log.read_text()[-2000:]}")
            try:
                import httpx

                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except Exception:
                pass
            time.sleep(0.5)
        for _ in stream_chat(f"{url}/v1", model, [{"role": "user", "content": FIXED_PROMPTS[0]}], max_tokens=4):
            pass
        return tree_rss_bytes(proc.pid)
    finally:
        stop_launcher(proc, grace_s=10)


def make_adapter_runs(base: Path, work: Path, count: int) -> dict[str, Path]:
    """`count` adapters of `base` with distinct weights, registered as runs in a store under `work`."""
    store = LocalStore(work / "store")
    adapters = {}
    for i in range(count):
        name = f"desk-{i + 1}"
        adapters[name] = work / "adapters" / name
        save_adapter(base, adapters[name], rank=8, seed=100 + i)
        register_run(store, work / "run_dirs", f"run-{name}", base, adapters[name], 8)
    return adapters


def merged_copy(base: Path, adapter: Path, out: Path) -> Path:
    from workloads.train.export import merge_adapter

    merge_adapter(adapter, base, out)
    return out


def memory_comparison(base: Path, adapters: dict[str, Path], work: Path, timeout_s: float) -> dict:
    """Resident memory: base alone, base + every adapter in one peft engine, and a process per fine-tune."""
    def peft_argv(port: int, names: list[str]) -> list[str]:
        return [sys.executable, "-m", "workloads.serve.engine.server", "--base", str(base), "--port", str(port),
                "--dtype", "float32", "--lora-modules", *[json.dumps({"name": n, "path": str(adapters[n])}) for n in names]]

    def transformers_argv(folder: Path, port: int) -> list[str]:
        return [sys.executable, "-m", "transformers.cli.transformers", "serve", str(folder), "--host", "127.0.0.1",
                "--port", str(port), "--device", "cpu", "--dtype", "float32", "--continuous-batching",
                "--cb-num-blocks", "8", "--log-level", "warning"]

    figures: dict[str, float] = {}
    port = free_port()
    figures["base_alone"] = engine_rss(peft_argv(port, []), f"http://127.0.0.1:{port}", "base", work / "m-base.log", timeout_s)
    port = free_port()
    figures["base_and_adapters_one_process"] = engine_rss(peft_argv(port, list(adapters)), f"http://127.0.0.1:{port}",
                                                          list(adapters)[0], work / "m-all.log", timeout_s)
    name, path = next(iter(adapters.items()))
    per_process = {}
    for label, folder in (("base", base), ("one_merged_fine_tune", merged_copy(base, path, work / "merged" / name))):
        port = free_port()
        per_process[label] = engine_rss(transformers_argv(folder, port), f"http://127.0.0.1:{port}", str(folder),
                                        work / f"m-{label}.log", timeout_s)
    # every merged copy has the base's shape and size: one is measured and counted once per fine-tune
    figures["process_per_fine_tune"] = per_process["base"] + len(adapters) * per_process["one_merged_fine_tune"]
    figures["process_per_fine_tune_measured"] = per_process
    one = figures["base_and_adapters_one_process"] / figures["base_alone"]
    return {"rss_bytes": figures, "adapters": len(adapters),
            "one_process_over_base_alone": one, "meets_target": one <= MEMORY_TARGET, "target": MEMORY_TARGET,
            "process_per_fine_tune_over_one_process": figures["process_per_fine_tune"] / figures["base_and_adapters_one_process"]}


def spread_load(api: str, names: list[str], clients: int, requests: int, max_tokens: int, tokenizer) -> dict:
    """`requests` requests from `clients` concurrent clients, request i to names[i % len(names)]; tokens/s per name
    over the level's wall time, and in total. Any failed request raises."""
    jobs = [(names[i % len(names)], [{"role": "user", "content": FIXED_PROMPTS[i % len(FIXED_PROMPTS)]}])
            for i in range(requests)]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(lambda job: (job[0], one_request(api, job[0], job[1], max_tokens, tokenizer)), jobs))
    wall = time.perf_counter() - start
    per_name = {}
    for name in dict.fromkeys(names):
        mine = [r for n, r in results if n == name]
        per_name[name] = {"requests": len(mine), "output_tokens": sum(r["tokens"] for r in mine),
                          "tokens_per_second": sum(r["tokens"] for r in mine) / wall,
                          "ttft_s": summary([r["ttft_s"] for r in mine]), "tpot_s": summary([r["tpot_s"] for r in mine])}
    tokens = sum(r["tokens"] for _, r in results)
    return {"clients": clients, "requests": requests, "wall_s": wall, "failed": 0,
            "output_tokens": tokens, "equal_output_tokens": equal_tokens([r for _, r in results], max_tokens),
            "throughput_tokens_per_second": tokens / wall, "per_name": per_name,
            "ttft_s": summary([r["ttft_s"] for _, r in results]), "tpot_s": summary([r["tpot_s"] for _, r in results])}


def bench_adapters(args: argparse.Namespace, base: Path, tokenizer) -> dict:
    """The adapters path in a temporary folder, removed at the end (adapters, merged copies and logs: about 535 MB
    with SmolLM2-135M)."""
    with tempfile.TemporaryDirectory(prefix="bench-adapters-") as folder:
        return adapters_figures(args, base, tokenizer, Path(folder))


def adapters_figures(args: argparse.Namespace, base: Path, tokenizer, work: Path) -> dict:
    print(f"bench: adapters: making {args.adapters} adapters of {base}", file=sys.stderr, flush=True)
    adapters = make_adapter_runs(base, work, args.adapters)
    print("bench: adapters: memory", file=sys.stderr, flush=True)
    memory = memory_comparison(base, adapters, work, args.startup_timeout)
    (work / "model").mkdir()
    (work / "model" / "base").symlink_to(base.resolve())
    run = parse_run_config({
        "name": "bench-adapters", "paths": {"root": str(work), "model_dir": str(work / "model")},
        "model": {"source": f"dir:{base}"}, "data": {"source": "sample", "rows": 4},
        "serve": {"engine": "peft", "device": "cpu", "dtype": "float32", "runs_store": str(work / "store"),
                  "stack": STACK, "max_batch": args.clients},
    }, "bench/serve.py")
    config = work / "run_config.json"
    config.write_text(run.model_dump_json())
    env = {k: v for k, v in os.environ.items() if k != "FT_API_KEY"}
    flags = [a for name in adapters for a in ("--adapter", f"{name}=run-{name}")]
    proc, url = start_launcher(config, flags, env, work / "serve.log", args.startup_timeout, cwd=ROOT)
    api = f"{url}/v1"
    try:
        one_request(api, "base", [{"role": "user", "content": FIXED_PROMPTS[0]}], 4, tokenizer)
        print("bench: adapters: base only", file=sys.stderr, flush=True)
        base_only = spread_load(api, ["base"], args.clients, args.requests, args.max_tokens, tokenizer)
        print("bench: adapters: base + adapters", file=sys.stderr, flush=True)
        mixed = spread_load(api, ["base", *adapters], args.clients, args.requests, args.max_tokens, tokenizer)
    finally:
        stop_launcher(proc)
    vllm = vllm_side(args, run, config, adapters, env, work, tokenizer) if args.vllm_python else None
    print("bench: adapters: one merged fine-tune in transformers serve", file=sys.stderr, flush=True)
    run.merged_dir.parent.mkdir(parents=True, exist_ok=True)
    run.merged_dir.symlink_to(work / "merged" / next(iter(adapters)))  # memory_comparison merged it already
    merged_run = run.model_copy(update={"serve": run.serve.model_copy(update={"engine": "transformers",
                                                                              "cb_num_blocks": 64})})
    config.write_text(merged_run.model_dump_json())
    proc, url = start_launcher(config, ["--no-base"], env, work / "serve-merged.log", args.startup_timeout, cwd=ROOT)
    try:
        one_request(f"{url}/v1", "finetuned", [{"role": "user", "content": FIXED_PROMPTS[0]}], 4, tokenizer)
        merged = spread_load(f"{url}/v1", ["finetuned"], args.clients, args.requests, args.max_tokens, tokenizer)
    finally:
        stop_launcher(proc)
    over_merged = ratio(mixed["throughput_tokens_per_second"], merged["throughput_tokens_per_second"])
    ttft_no_worse = mixed["ttft_s"]["median"] <= merged["ttft_s"]["median"]
    sides = {"base_only": base_only, "base_and_adapters": mixed, "merged_transformers_serve": merged,
             **({"base_and_adapters_vllm": vllm} if vllm else {})}
    return {"memory": memory, "load": {
        **sides,
        "vllm_over_peft": ratio(vllm["throughput_tokens_per_second"], mixed["throughput_tokens_per_second"]) if vllm else None,
        "mixed_over_base_only": ratio(mixed["throughput_tokens_per_second"], base_only["throughput_tokens_per_second"]),
        "mixed_over_merged": over_merged,
        "ttft_median_s": {name: side["ttft_s"]["median"] for name, side in sides.items()},
        "tpot_median_s": {name: side["tpot_s"]["median"] for name, side in sides.items()},
        "equal_output_tokens": all(side["equal_output_tokens"] for side in sides.values()),
        "issue_40_goal": {"clients": args.clients, "mixed_over_merged_at_least": ISSUE_40_GOAL,
                          "ttft_no_worse": ttft_no_worse,
                          "met": over_merged is not None and over_merged >= ISSUE_40_GOAL and ttft_no_worse},
    }}


def vllm_side(args: argparse.Namespace, run, config: Path, adapters: dict[str, Path], env: dict[str, str], work: Path,
              tokenizer) -> dict:
    """The same base, adapters and load on vLLM's CPU build (its own environment, --vllm-python): one process,
    the adapters as --lora-modules (vLLM's dtype: bfloat16 on CPU)."""
    print("bench: adapters: base + adapters in vLLM", file=sys.stderr, flush=True)
    vllm_run = run.model_copy(update={"serve": run.serve.model_copy(update={
        "engine": "vllm", "vllm_python": str(args.vllm_python), "max_loras_per_batch": len(adapters),
        "vllm_args": ["--max-model-len", "2048", "--distributed-executor-backend", "uni"]})})
    config.write_text(vllm_run.model_dump_json())
    flags = [a for name in adapters for a in ("--adapter", f"{name}=run-{name}")]
    proc, url = start_launcher(config, flags, {**env, "VLLM_CPU_KVCACHE_SPACE": "2"}, work / "serve-vllm.log",
                               args.startup_timeout, cwd=ROOT)
    try:
        one_request(f"{url}/v1", "base", [{"role": "user", "content": FIXED_PROMPTS[0]}], 4, tokenizer)
        return spread_load(f"{url}/v1", ["base", *adapters], args.clients, args.requests, args.max_tokens, tokenizer)
    finally:
        stop_launcher(proc)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "workloads" / "configs" / "local.json"))
    parser.add_argument("--paths", nargs="+", choices=("merged", "adapter-4bit", "adapters"),
                        default=["merged", "adapter-4bit", "adapters"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--requests", type=int, default=16, help="requests per level (at least the concurrency)")
    parser.add_argument("--single-requests", type=int, default=4, help="requests at concurrency 1")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    parser.add_argument("--adapters", type=int, default=3, help="adapters path: how many adapters")
    parser.add_argument("--clients", type=int, default=16, help="adapters path: concurrent clients")
    parser.add_argument("--base", type=Path, help="adapters path: a prepared base model folder (default: the config's)")
    parser.add_argument("--vllm-python", type=Path,
                        help="adapters path: also serve the same load from vLLM's CPU build in this interpreter's "
                             "environment (.venv-vllm/bin/python, made by make vllm-venv)")
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="every request generates --max-tokens tokens (default; vLLM's benchmark does the same)")
    return parser.parse_args(argv)


def bench_paths(args: argparse.Namespace, run: RunConfig, paths: list[str], tokenizer: Any) -> dict[str, dict]:
    """Each merged/adapter-4bit path's server (the first one also serving the base) measured at each concurrency."""
    prompts = [[{"role": "user", "content": p.input}] for p in
               read_prompts(load_tokenized(run.test_tokenized_dir, 16), run.test_jsonl, 16)]
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    config = work / "run_config.json"
    config.write_text(run.model_dump_json())
    results: dict[str, dict] = {}
    for path in paths:
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
    return results


def path_ratios(results: dict[str, dict], levels: list[str]) -> dict[str, Any]:
    """Each fine-tuned path over the base at each level (throughput, TTFT, TPOT, the target met), and batched
    over single."""
    ratios: dict[str, Any] = {}
    for key in [k for k in results if k != "base"]:
        entry: dict = {}
        for c in levels:
            r = ratio(results[key][c]["throughput_tokens_per_second"], results["base"][c]["throughput_tokens_per_second"])
            entry[f"finetuned_over_base_c{c}"] = r
            entry[f"meets_target_c{c}"] = r is not None and r >= TARGET_RATIO
            for figure in ("ttft_s", "tpot_s"):
                entry[f"{figure.removesuffix('_s')}_finetuned_over_base_c{c}"] = ratio(
                    results[key][c][figure]["median"], results["base"][c][figure]["median"])
        if len(levels) > 1:
            entry["batched_over_single_finetuned"] = ratio(results[key][levels[-1]]["throughput_tokens_per_second"],
                                                           results[key][levels[0]]["throughput_tokens_per_second"])
        ratios[key] = entry
    if len(levels) > 1:
        ratios["batched_over_single_base"] = ratio(results["base"][levels[-1]]["throughput_tokens_per_second"],
                                                   results["base"][levels[0]]["throughput_tokens_per_second"])
    return ratios


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    global IGNORE_EOS
    IGNORE_EOS = args.ignore_eos
    started_load = load_average()

    from transformers import AutoTokenizer

    run = load_run_config(args.config)
    base = args.base or run.base_model_dir
    tokenizer = AutoTokenizer.from_pretrained(base)
    report: dict = {"max_tokens": args.max_tokens, "ignore_eos": args.ignore_eos}
    if "adapters" in args.paths:
        report["adapters"] = bench_adapters(args, base, tokenizer)
    paths = [p for p in args.paths if p != "adapters"]
    if paths:
        results = bench_paths(args, run, paths, tokenizer)
        report |= {"settings": {"max_tokens": args.max_tokens, "concurrency": args.concurrency,
                                "requests": args.requests, "single_requests": args.single_requests,
                                "engine": "transformers serve --continuous-batching",
                                "device": (run.serve.device if run.serve else "auto"), "target_ratio": TARGET_RATIO},
                   "results": results, "ratios": path_ratios(results, [str(c) for c in args.concurrency])}
    report["load_average"] = {"start": started_load, "end": load_average()}
    print(json.dumps(report, indent=2))
    return 0

if __name__ == "__main__":
    sys.exit(main())
