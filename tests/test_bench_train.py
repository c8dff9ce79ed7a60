"""bench/train.py's random base: built in a child process, so the bench's parent holds no device memory."""

from __future__ import annotations

import json
import math
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
