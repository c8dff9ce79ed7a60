"""Host memory of loading a base under FSDP: how much rank 1's resident memory grows while the model is loaded and
sharded, beside the model's size, over 2 gloo ranks on CPU.

    python bench/fsdp_load.py [--method full|lora] [--layers 16] [--hidden 1024] [--intermediate 4096]
                              [--vocab 32000] [--tie] [--modes every_rank,rank0]

A random Llama of the given shape is saved once as safetensors (no hub); each mode then runs in its own 2-rank
torchrun job:

- `every_rank` (before issue 39): every rank loads the whole base with `from_pretrained`, then shards it
  (`workloads.train.sharding.shard`).
- `rank0` (the trainer now, `workloads.train.finetune.load_model` + `sharding.shard_from_rank0`): rank 0 loads,
  rank 1 builds the model on the meta device, rank 0's weights are broadcast into the shards.

Growth = peak resident set (`ru_maxrss`) after loading and sharding minus the resident set before loading. On CPU
a rank's shard lives in host memory (on a GPU it would not), so the growth beyond the shard it holds is shown too.
Prints JSON: the model's bytes at the load dtype and per mode rank 1's growth, its ratio to the model, the same
beyond its shard, and the bytes of parameters each rank holds after sharding.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds scripts named like stdlib modules (tokenize.py); keep it off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _worker(model_dir: Path, method: str, mode: str, out: Path) -> None:
    import peft  # noqa: F401 - imported before the first reading, like everything the load needs
    import torch
    import torch.distributed as dist
    from transformers.models.llama import modeling_llama  # noqa: F401

    from documents.run_config import parse_run_config
    from workloads.train import sharding
    from workloads.train.attention import AttentionChoice
    from workloads.train.finetune import load_model

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train = parse_run_config({"name": "bench", "model": {"source": f"dir:{model_dir}"},
                              "data": {"source": "sample", "rows": 10, "max_length": 64},
                              "train": {"method": method, "parallelism": "fsdp"}}, "bench").train
    choice = AttentionChoice(implementation="sdpa", backend="default")
    before = _rss_bytes()
    if mode == "every_rank":
        os.environ["RANK"] = "0"  # every rank takes rank 0's path: the whole base from disk
    model = load_model(model_dir, train, "fp32", 0, choice, checkpointing=False, fsdp=True)
    os.environ["RANK"] = str(rank)
    if mode == "every_rank":
        sharding.shard(model, torch.float32, cuda=False)
    else:
        sharding.shard_from_rank0(model, torch.float32, cuda=False)
    dist.barrier()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    held = sharding.local_parameter_bytes(model, True) + sharding.local_parameter_bytes(model, False)
    (out / f"rank{rank}.json").write_text(json.dumps({"growth_bytes": peak - before, "held_bytes": held}))
    dist.destroy_process_group()


def _save_model(folder: Path, layers: int, hidden: int, intermediate: int, vocab: int, tie: bool) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
                         num_key_value_heads=hidden // 256, intermediate_size=intermediate, vocab_size=vocab,
                         tie_word_embeddings=tie)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", default="full", choices=("full", "lora"))
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--tie", action="store_true", help="tie the LM head to the embeddings (SmolLM2's layout)")
    parser.add_argument("--modes", default="every_rank,rank0")
    parser.add_argument("--worker", nargs=3, metavar=("MODEL_DIR", "MODE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(Path(args.worker[0]), args.method, args.worker[1], Path(args.worker[2]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        params = _save_model(model_dir, args.layers, args.hidden, args.intermediate, args.vocab, args.tie)
        model_bytes = params * 4  # fp32: a full fine-tune's masters, and the compute dtype on CPU
        result: dict[str, object] = {"method": args.method, "params": params, "model_bytes_fp32": model_bytes,
                                     "ranks": 2, "modes": {}}
        for mode in args.modes.split(","):
            out = Path(tmp) / mode
            out.mkdir()
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                            "--master_port", str(29500 + os.getpid() % 1000), __file__, "--method", args.method,
                            "--worker", str(model_dir), mode, str(out)], cwd=ROOT, check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
            ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
            result["modes"][mode] = {  # type: ignore[index]
                "rank1_growth_bytes": ranks[1]["growth_bytes"],
                "rank1_growth_over_model": round(ranks[1]["growth_bytes"] / model_bytes, 3),
                "rank1_growth_beyond_its_shard_over_model": round(
                    (ranks[1]["growth_bytes"] - ranks[1]["held_bytes"]) / model_bytes, 3),
                "rank0_growth_bytes": ranks[0]["growth_bytes"],
                "held_bytes_per_rank": [r["held_bytes"] for r in ranks],
            }
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
