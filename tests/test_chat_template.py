"""Qwen3's thinking switch rendered one way in training, evaluation and serving (issue 42, item 8): Qwen3's own
chat template (TRL ships it verbatim, trl/chat_templates/qwen3.jinja, to recognise the model) on the SmolLM2
tokenizer, whose ChatML tokens it uses (`<|im_end|>` ends a turn)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads.common.chat_template import prompt_ids, template_options
from workloads.data.tokenize import _encode
from workloads.serve.budget import PromptCounter

CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What does a bond pay?"},
        {"role": "assistant", "content": "Fixed coupons, then the principal at maturity."}]
EMPTY_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen3_template_dir(smollm2_base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import trl
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_base_dir)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    folder = tmp_path_factory.mktemp("qwen3-template")
    tokenizer.save_pretrained(folder)
    return folder


def test_training_puts_the_empty_think_block_in_the_prompt_not_the_labels(qwen3_template_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen3_template_dir)
    ((ids, labels, start),) = _encode(tokenizer, [CHAT])
    assert tokenizer.decode(ids[:start]).endswith("What does a bond pay?<|im_end|>\n" + EMPTY_THINK)
    learned = [token for token, label in zip(ids, labels) if label != -100]
    assert tokenizer.decode(learned) == CHAT[-1]["content"] + "<|im_end|>"


def test_eval_and_serving_prompts_are_trainings(qwen3_template_dir: Path) -> None:
    """Evaluation prompts are the tokenized test rows up to `start`; the peft engine and the gateway's budget
    render a request with prompt_ids: the same tokens, the thinking switch off."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen3_template_dir)
    ((ids, _, start),) = _encode(tokenizer, [CHAT])
    assert template_options(tokenizer) == {"enable_thinking": False}
    assert prompt_ids(tokenizer, CHAT[:-1]) == ids[:start]
    assert PromptCounter(qwen3_template_dir).count(CHAT[:-1]) == start


def test_a_template_without_the_switch_renders_as_before(smollm2_base_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_base_dir)
    assert template_options(tokenizer) == {}
    expected = tokenizer.apply_chat_template(CHAT[:-1], add_generation_prompt=True, tokenize=False)
    assert prompt_ids(tokenizer, CHAT[:-1]) == tokenizer(expected, add_special_tokens=False)["input_ids"]
