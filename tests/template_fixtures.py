"""A model folder with Qwen3's chat template (a thinking switch) on the SmolLM2 tokenizer, and folders of a
model's weights under another tokenizer: for the tests of how engines render prompts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def qwen3_template_dir(smollm2_base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3's own chat template (TRL ships it verbatim, trl/chat_templates/qwen3.jinja) on SmolLM2's tokenizer."""
    import trl
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_base_dir)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    folder = tmp_path_factory.mktemp("qwen3-template")
    tokenizer.save_pretrained(folder)
    return folder


def model_folder(tokenizer_dir: Path, weights_dir: Path, out: Path) -> Path:
    """A model folder: `weights_dir`'s config and weights with `tokenizer_dir`'s tokenizer and chat template."""
    out.mkdir(parents=True)
    for item in weights_dir.iterdir():
        if item.name in ("config.json", "generation_config.json") or item.suffix == ".safetensors":
            shutil.copy2(item, out / item.name)
    for item in tokenizer_dir.iterdir():
        shutil.copy2(item, out / item.name)
    return out
