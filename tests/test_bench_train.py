"""bench/train.py's random base: built in a child process, so the bench's parent holds no device memory."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]

# SmolLM2-135M from its published config: vocab 49,152 (tied), hidden 576, 30 layers, MLP 1,536, 9 heads of 64,
# 3 key/value heads. Per layer: q, o 576x576; k, v 576x192; gate, up, down 576x1,536; two RMSNorms.
SMOL_LAYER = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576
SMOL_PARAMS = 49152 * 576 + 30 * SMOL_LAYER + 576


def test_the_random_base_is_built_outside_the_bench_process(smollm2_base_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "base"
    probe = (
        "import importlib.util, json, sys\n"
        "from pathlib import Path\n"
        f"spec = importlib.util.spec_from_file_location('bench_train', {str(ROOT / 'bench' / 'train.py')!r})\n"
        "bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)\n"
        f"bench.prepare_random_base('HuggingFaceTB/SmolLM2-135M-Instruct', Path({str(out)!r}),"
        f" Path({str(smollm2_base_dir)!r}))\n"
        "print(json.dumps({'torch_imported': 'torch' in sys.modules}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # A parent that never imported torch cannot hold CUDA memory while the arms run.
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"torch_imported": False}

    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (576, 30, 49152)
    assert (out / "tokenizer.json").is_file() and not out.with_name("base.tmp").exists()
    params = 0
    for shard in out.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as tensors:
            for name in tensors.keys():
                shape = tensors.get_slice(name).get_shape()
                params += math.prod(shape)
    assert params == SMOL_PARAMS == 134_515_008


def _bench_module() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_mixed_data_set_puts_short_chat_turns_beside_each_long_row(tiny_prepared, tmp_path: Path) -> None:
    from datasets import load_from_disk

    bench = _bench_module()
    dense = load_from_disk(str(tiny_prepared.train_tokenized_dir))
    out = bench.build_mixed(tiny_prepared.train_tokenized_dir, tiny_prepared.base_model_dir, 256, tmp_path / "mixed")
    mixed = load_from_disk(str(out))
    every = bench.MIXED_SHORT_PER_LONG + 1
    longs = range(0, len(dense), every)
    assert len(mixed) == every * len(longs)
    for slot, index in enumerate(longs):
        assert mixed[slot * every]["input_ids"] == dense[index]["input_ids"]
        for row in mixed.select(range(slot * every + 1, (slot + 1) * every)):
            assert row["length"] == len(row["input_ids"]) <= 128
            assert any(label != -100 for label in row["labels"])
    again = bench.build_mixed(tiny_prepared.train_tokenized_dir, tiny_prepared.base_model_dir, 256, tmp_path / "b")
    assert load_from_disk(str(again))["input_ids"] == mixed["input_ids"]


def test_timed_figures_leave_out_the_warm_up_and_weigh_each_step_by_its_time() -> None:
    from documents.metrics import MetricsRecord

    bench = _bench_module()
    records = [MetricsRecord(step=s, epoch=0.1 * s, loss=4.0 - s, tokens=100 * s, tokens_per_second=10.0 * s,
                             padding_efficiency=0.5) for s in (1, 2, 3, 4)]
    records.insert(2, MetricsRecord(step=2, epoch=0.2, eval_loss=3.5))
    figures = bench.timed_figures(records, warmup=1)
    # steps 2-4: 900 real tokens over 200/20 + 300/30 + 400/40 = 30 s; half of what was processed was padding
    assert figures["timed_steps"] == 3 and figures["seconds"] == 30.0 and figures["real_tokens"] == 900
    assert figures["effective_tokens_per_second"] == 30.0 and figures["processed_tokens_per_second"] == 60.0
    assert (figures["final_loss"], figures["mean_loss_second_half"], figures["steps"]) == (0.0, 0.5, 4)


def test_the_sample_is_spread_over_the_length_distribution() -> None:
    bench = _bench_module()
    assert bench.length_ranks([5, 1, 4, 2, 3], 3) == [0, 1, 4], "lengths 1, 3, 5: ranks 0, 2, 4"
    assert bench.length_ranks([7, 7, 7], 5) == [0, 1, 2]
    assert bench.length_ranks(list(range(100, 0, -1)), 4) == [0, 33, 66, 99], "ranks 0, 33, 66, 99 of 100"


def test_the_last_pass_is_timed_when_every_arm_trains_the_same_sample() -> None:
    from documents.metrics import MetricsRecord

    bench = _bench_module()
    records = [MetricsRecord(step=s, epoch=round(s / 3, 4), loss=1.0, tokens=100, tokens_per_second=50.0,
                             padding_efficiency=1.0) for s in range(1, 7)]
    figures = bench.timed_figures(records, warmup=1, epochs=2)
    assert (figures["timed_steps"], figures["real_tokens"], figures["seconds"]) == (3, 300, 6.0)


def test_the_bench_trains_this_trainer_through_the_training_jobs_entry_point(tiny_prepared, tmp_path: Path) -> None:
    from train_fixtures import with_train, write_config

    run = with_train(tiny_prepared, tmp_path / "run", max_steps=3, gradient_accumulation_steps=1, batching="auto")
    config = write_config(run, tmp_path / "bench.json")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "train.py"), "--config", str(config), "--rows", "6",
                           "--epochs", "2", "--arms", "auto,naive", "--datasets", "dense"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    # what explains a figure that differs between machines: library versions, threads, the machine's load
    from importlib.metadata import version

    environment = report["environment"]
    assert {name: environment["versions"][name] for name in ("torch", "transformers", "trl", "peft")} == \
        {name: version(name) for name in ("torch", "transformers", "trl", "peft")}
    assert environment["cpus_usable"] == len(os.sched_getaffinity(0)) and environment["cpu_model"]
    dense = report["datasets"]["dense"]
    auto, naive = dense["auto"], dense["naive"]
    for arm in (auto, naive):
        assert arm["threads"] >= 1 and len(arm["load_average"]["before"]) == len(arm["load_average"]["after"]) == 3
    # both arms timed over the second pass of the same 6 rows: those at ranks 0, 1, 2, 3, 4, 5 of 0..n-1 spread
    # evenly over the lengths, every real token of them once
    from datasets import load_from_disk

    lengths = sorted(load_from_disk(str(tiny_prepared.train_tokenized_dir))["length"])
    sample = [lengths[round(k * (len(lengths) - 1) / 5)] for k in range(6)]
    assert auto["real_tokens"] == naive["real_tokens"] == sum(sample) and dense["same_real_tokens"] is True
    assert naive["steps"] == 2 * naive["timed_steps"] == 2 * 3  # micro_batch_size 2, no accumulation: 3 steps a pass
    assert naive["batching"] is None and naive["micro_batch_tokens"] == 2 * 256  # micro_batch_size rows of max_length
    assert naive["padding_efficiency"] == round(sum(sample) / (6 * 256), 4)
    assert dense["auto_over_naive"] == round(auto["effective_tokens_per_second"] / naive["effective_tokens_per_second"], 3)
    assert dense["auto_over_naive_padding_saved"] == round(auto["padding_efficiency"] / naive["padding_efficiency"], 3)
    assert dense["auto_over_naive_per_processed_token"] == round(
        auto["processed_tokens_per_second"] / naive["processed_tokens_per_second"], 3)
    # the decision comes from the run manifest train_run writes: the sample's rows, its token budget
    assert auto["batching"]["configured"] == "auto" and auto["batching"]["rows"] == 6
    assert auto["batching"]["chosen"] in ("packed", "grouped") and auto["effective_tokens_per_second"] > 0
