"""Qwen3's thinking switch rendered one way in training, evaluation and serving (issue 42, item 8): Qwen3's own
chat template (TRL ships it verbatim, trl/chat_templates/qwen3.jinja, to recognise the model) on the SmolLM2
tokenizer, whose ChatML tokens it uses (`<|im_end|>` ends a turn)."""

from __future__ import annotations

from pathlib import Path

import pytest
from template_fixtures import model_folder

from workloads.common.chat_template import prompt_ids, template_options
from workloads.data.tokenize import _encode
from workloads.serve.gateway.prompt_counter import PromptCounter

CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What does a bond pay?"},
        {"role": "assistant", "content": "Fixed coupons, then the principal at maturity."}]
EMPTY_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


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


def transformers_serve_params(argv: list[str]) -> dict:
    """`transformers serve`'s own command line parser (click, through typer) applied to a plan's argv."""
    from transformers.cli.transformers import app

    serve = app.commands["serve"]
    return serve.make_context("serve", argv[argv.index("serve") + 1:]).params


def test_engines_that_render_prompts_themselves_are_told_to_turn_thinking_off(
        qwen3_template_dir: Path, tiny_model_dir: Path, smollm2_base_dir: Path, tmp_path: Path) -> None:
    """Issue 42, item 8: `transformers serve` renders prompts with the template's defaults (Qwen3: thinking on).
    It is started with the switch off (--chat-template-kwargs); a template without the switch gets no flag.
    vLLM's --default-chat-template-kwargs is read by vLLM's own parser in test_serve_vllm_argv.py."""
    import json

    from documents.run_config import parse_run_config
    from documents.sections.serve import ServeConfig
    from workloads.serve.launcher.engine_plan import plan_transformers

    for template, expected in ((qwen3_template_dir, {"enable_thinking": False}), (smollm2_base_dir, None)):
        root = tmp_path / template.name
        run = parse_run_config({"name": "t", "paths": {"root": str(root), "model_dir": str(root / "model")},
                                "model": {"source": "dir:/m"}, "data": {"source": "sample", "rows": 4}})
        model_folder(template, tiny_model_dir, run.base_model_dir)
        model_folder(template, tiny_model_dir, run.merged_dir)
        for engine in plan_transformers(run, ServeConfig(device="cpu")):
            given = transformers_serve_params(engine.argv)["chat_template_kwargs"]
            assert (json.loads(given) if given else None) == expected, engine.argv


@pytest.mark.slow
def test_transformers_serve_renders_the_prompt_training_rendered(qwen3_template_dir: Path, tiny_model_dir: Path,
                                                                 tmp_path: Path) -> None:
    """The engine as the launcher starts it, on the tiny model with Qwen3's template: the prompt it counts is
    training's (the empty think block included), not the thinking prompt the template renders by default."""
    import subprocess
    import time

    import httpx
    from transformers import AutoTokenizer

    from documents.sections.serve import ServeConfig
    from workloads.serve.launcher.engine_plan import transformers_argv
    from serve_process import free_port, stop_launcher

    folder = model_folder(qwen3_template_dir, tiny_model_dir, tmp_path / "qwen3-tiny")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    expected = len(prompt_ids(tokenizer, CHAT[:-1]))
    thinking = len(tokenizer.apply_chat_template(CHAT[:-1], add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"])
    assert expected > thinking
    port = free_port()
    log = tmp_path / "engine.log"
    argv = transformers_argv(folder, port, ServeConfig(device="cpu", dtype="float32", cb_num_blocks=8))
    engine = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        body = {"model": str(folder), "messages": CHAT[:-1], "max_tokens": 4, "temperature": 0.0}
        reply = None
        for _ in range(240):
            assert engine.poll() is None, log.read_text()[-3000:]
            try:
                reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120)
                break
            except httpx.TransportError:
                time.sleep(0.5)
        assert reply is not None and reply.status_code == 200, log.read_text()[-3000:]
        answer = reply.json()
        assert answer["usage"]["prompt_tokens"] == expected, (answer["usage"], expected, thinking)
        assert "<think>" not in answer["choices"][0]["message"]["content"]
    finally:
        stop_launcher(engine, grace_s=10)
