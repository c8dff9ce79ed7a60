"""Base model preparation from dir: and bad sources, on the tiny model: manifest, no-op re-run, atomicity."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from documents.atomic import sha256_file
from documents.stage_manifest import ModelManifest
from workloads.model.folder import ModelFolderError
from workloads.model.prepare import prepare_model
from workloads.model.source import SourceError, parse_source

ROOT = Path(__file__).resolve().parents[1]


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def test_dir_source_makes_manifest_matching_the_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "base"
    manifest = prepare_model(f"dir:{tiny_model_dir}", out)
    on_disk = json.loads((out / "manifest.json").read_text())
    assert ModelManifest.model_validate(on_disk) == manifest and on_disk["weights"].keys() == manifest.weights.keys()
    assert manifest.source == f"dir:{tiny_model_dir}"
    assert set(manifest.weights) == {p.name for p in out.glob("*.safetensors")}
    for name, info in manifest.weights.items():
        assert info.sha256 == sha256_file(out / name)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert manifest.parameters == model.num_parameters()
    assert manifest.dtype == "F32"
    assert AutoTokenizer.from_pretrained(out).chat_template
    assert _leftovers(tmp_path) == ["base"]


def test_same_source_again_is_a_no_op(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "base"
    first = prepare_model(f"dir:{tiny_model_dir}", out)
    inode = (out / "manifest.json").stat().st_ino
    assert prepare_model(f"dir:{tiny_model_dir}", out) == first
    assert (out / "manifest.json").stat().st_ino == inode


def test_force_rebuilds_and_replaces_atomically(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "base"
    prepare_model(f"dir:{tiny_model_dir}", out)
    (out / "stale.txt").write_text("from an older build")
    prepare_model(f"dir:{tiny_model_dir}", out, force=True)
    assert not (out / "stale.txt").exists()
    assert _leftovers(tmp_path) == ["base"]


def test_cast_dtype_is_recorded(tiny_model_dir: Path, tmp_path: Path) -> None:
    manifest = prepare_model(f"dir:{tiny_model_dir}", tmp_path / "base", dtype="bfloat16")
    assert manifest.dtype == "BF16"
    assert manifest.requested_dtype == "bfloat16"


@pytest.mark.parametrize("source", ["dir:/no/such/folder", "gguf:/no/such/model.gguf"])
def test_missing_source_names_it_and_writes_nothing(source: str, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not found"):
        prepare_model(source, tmp_path / "out" / "base")
    assert _leftovers(tmp_path / "out") == []


def test_corrupt_gguf_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    with pytest.raises(SourceError, match="cannot read GGUF file .*broken.gguf"):
        prepare_model(f"gguf:{bad}", tmp_path / "out" / "base")
    assert _leftovers(tmp_path / "out") == []


def test_corrupt_safetensors_in_dir_source(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(tiny_model_dir, source)
    (source / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelFolderError, match="model.safetensors"):
        prepare_model(f"dir:{source}", tmp_path / "out" / "base")
    assert _leftovers(tmp_path / "out") == []


def test_dir_without_weights_or_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(tiny_model_dir, source)
    (source / "model.safetensors").unlink()
    with pytest.raises(SourceError, match="no \\*.safetensors"):
        prepare_model(f"dir:{source}", tmp_path / "out")
    (source / "config.json").unlink()
    with pytest.raises(SourceError, match="no config.json"):
        prepare_model(f"dir:{source}", tmp_path / "out")


def test_dir_without_chat_template_is_rejected(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(tiny_model_dir, source)
    (source / "chat_template.jinja").unlink()
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match="no chat template"):
        prepare_model(f"dir:{source}", tmp_path / "out" / "base")
    assert _leftovers(tmp_path / "out") == []


def test_unreachable_hub_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with pytest.raises(SourceError, match="hub:Qwen/Qwen3-14B: cannot download from the Hugging Face Hub"):
        prepare_model("hub:Qwen/Qwen3-14B", tmp_path / "out" / "base")
    assert _leftovers(tmp_path / "out") == []


@pytest.mark.parametrize("source", ["Qwen/Qwen3-14B", "hub:no-slash", "s3:bucket/key", "dir:"])
def test_malformed_sources(source: str) -> None:
    with pytest.raises(SourceError):
        parse_source(source)


def test_cli_help_and_error_exit(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "workloads.model.prepare"]
    shown = subprocess.run([*run, "--help"], cwd=ROOT, capture_output=True, text=True)
    assert shown.returncode == 0 and "--source" in shown.stdout
    failed = subprocess.run([*run, "--source", "dir:/no/such", "--out", str(tmp_path / "m")],
                            cwd=ROOT, capture_output=True, text=True)
    assert failed.returncode == 1
    assert "error: dir:/no/such: folder not found" in failed.stderr


def test_a_gguf_file_is_parsed_once_inside_the_conversion_and_anew_outside(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    from workloads.model.prepare import gguf_read_once

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    own = gguf.GGUFReader
    with gguf_read_once():
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(str(path)) is first
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert gguf.GGUFReader is own and gguf.GGUFReader(str(path)) is not first
    assert first.get_tensor(0).data.tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()
    with pytest.raises(ValueError), gguf_read_once():
        raise ValueError("a failed conversion")
    assert gguf.GGUFReader is own
