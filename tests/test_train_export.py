"""export.py: the merged full-precision model reproduces base + adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from workloads.train.export import main


@pytest.fixture
def adapter_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A LoRA adapter with non-zero B weights (a fresh one would be a no-op and prove nothing)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    out = tmp_path / "adapter"
    lora.save_pretrained(out)
    return out


def test_merged_logits_match_base_plus_adapter(tiny_model_dir: Path, adapter_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel

    out = tmp_path / "merged"
    assert main(["--adapter", str(adapter_dir), "--base", str(tiny_model_dir), "--out", str(out)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("What is a bond coupon?", return_tensors="pt").input_ids
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        plain = base(ids).logits
        with_adapter = PeftModel.from_pretrained(base, adapter_dir)(ids).logits
        merged_model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        merged = merged_model(ids).logits
    assert not any("lora" in name for name, _ in merged_model.named_parameters())
    assert not torch.allclose(plain, with_adapter, atol=1e-3), "adapter must change the logits"
    torch.testing.assert_close(merged, with_adapter, atol=1e-4, rtol=1e-4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "export" and manifest["dtype"] == "float32"


def test_missing_adapter_is_named(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--adapter", str(tmp_path / "nope"), "--base", str(tiny_model_dir), "--out", str(tmp_path / "m")]) == 2
    assert "nope: not a PEFT adapter folder" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
