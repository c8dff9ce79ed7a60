"""Request fields per engine (issue 53): what an engine honours is forwarded, anything else is refused with a 400
naming the field, never dropped with a 200."""

from __future__ import annotations

import pytest

from workloads.serve.request import PEFT_UNSUPPORTED, parse_chat_request, refused_field

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("field,value", [("top_k", 5), ("min_p", 0.1), ("repetition_penalty", 1.1),
                                         ("logit_bias", {"42": -100}), ("structured_outputs", {"choice": ["a", "b"]})])
def test_vllm_decoding_fields_go_to_vllm_and_nowhere_else(field: str, value: object) -> None:
    request = parse_chat_request({**BASE, field: value})
    assert refused_field(request, "vllm") is None
    assert request.model_dump(exclude_none=True)[field] == value
    for engine in ("peft", "transformers"):
        assert refused_field(request, engine) == f"{field}: not accepted by this endpoint (engine {engine})"


@pytest.mark.parametrize("field", ["chat_template_kwargs", "chat_template", "add_generation_prompt", "request_id",
                                   "generation_config", "typo_field"])
def test_fields_that_set_the_server_are_refused_on_every_engine(field: str) -> None:
    request = parse_chat_request({**BASE, field: True})
    for engine in ("vllm", "peft", "transformers"):
        assert refused_field(request, engine).startswith(f"{field}: not accepted by this endpoint (engine {engine})")


@pytest.mark.parametrize("field,value", [("stop", ["\n"]), ("logprobs", True), ("top_logprobs", 2),
                                         ("response_format", {"type": "json_object"}), ("frequency_penalty", 0.5)])
def test_openai_fields_the_peft_engine_ignores_are_refused_there(field: str, value: object) -> None:
    """workloads.serve.engine.server reads model, messages, max_tokens, temperature, top_p, seed, ignore_eos, stream
    and stream_options only."""
    assert field in PEFT_UNSUPPORTED
    request = parse_chat_request({**BASE, field: value})
    assert refused_field(request, "peft") == f"{field}: not supported by engine peft (serve with engine vllm for it)"
    assert refused_field(request, "vllm") is None and refused_field(request, "transformers") is None
