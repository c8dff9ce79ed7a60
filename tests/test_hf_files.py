"""One reader each for Hugging Face's config.json and PEFT's adapter_config.json (documents/hf_files.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from documents.base import DocumentError
from documents.hf_files import read_adapter_config, read_decoder_config, write_adapter_config
from workloads.serve.token_budget import model_context
from planning.model_shapes import shape_for_source

# Qwen3-14B's published config.json, as the hub serves it (the keys this project reads, and a few it does not).
QWEN3_14B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
             "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
             "intermediate_size": 17408, "vocab_size": 151936, "tie_word_embeddings": False,
             "max_position_embeddings": 40960, "rope_theta": 1000000, "torch_dtype": "bfloat16"}


def test_a_model_folder_gives_the_shape_the_table_holds_for_that_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_14B))
    assert shape_for_source(f"dir:{tmp_path}") == shape_for_source("hub:Qwen/Qwen3-14B")
    assert model_context(tmp_path) == 40960


def test_a_multimodal_config_reads_its_text_decoder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "text_config": QWEN3_14B,
                                                      "vision_config": {"hidden_size": 1}}))
    assert read_decoder_config(tmp_path).hidden_size == 5120
    assert model_context(tmp_path) == 40960


@pytest.mark.parametrize(("content", "message"), [
    ("{", r"config.json: not a valid model config"),
    ("[1]", r"config.json: not a valid model config \(a JSON object expected\)"),
    ('{"hidden_size": "wide"}', r"config.json: not a valid model config \(hidden_size"),
])
def test_a_bad_model_config_is_named(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(DocumentError, match=message):
        read_decoder_config(tmp_path)
    assert model_context(tmp_path) is None


def test_a_config_without_decoder_dimensions_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    with pytest.raises(DocumentError, match="no num_hidden_layers, num_attention_heads, intermediate_size"):
        shape_for_source(f"dir:{tmp_path}")


def test_an_adapter_config_written_back_keeps_every_key_and_changes_only_the_base(tmp_path: Path) -> None:
    original = {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
                "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": "/old/base", "task_type": "CAUSAL_LM"}
    (tmp_path / "adapter_config.json").write_text(json.dumps(original))
    config = read_adapter_config(tmp_path)
    assert config.r == 16
    out = tmp_path / "view"
    out.mkdir()
    write_adapter_config(out, config.model_copy(update={"base_model_name_or_path": "/new/base"}))
    assert json.loads((out / "adapter_config.json").read_text()) == {**original, "base_model_name_or_path": "/new/base"}


def test_a_bad_adapter_config_is_named(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text('{"r": 0}')
    with pytest.raises(DocumentError, match=r"adapter_config.json: not a valid adapter config \(r:"):
        read_adapter_config(tmp_path)
    with pytest.raises(DocumentError, match=r"missing.*adapter_config.json: cannot read the adapter config"):
        read_adapter_config(tmp_path / "missing")
