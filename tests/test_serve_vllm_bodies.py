"""The gateway validates vLLM's /v1/completions, /tokenize and /detokenize as it validates chat (issue 64, item 6).

The probes: `POST /v1/completions {"model": "base", "prompt": "hi", "typo_field": 1}` and `{"best_of": 1000}`
answered 200 (vLLM drops both), `POST /detokenize {"model": "base", "tokens": [1e9]}` answered
`200 {"prompt": ""}`. The gateway app in process over SmolLM2's tokenizer; the vLLM engine behind it does not
answer, so a body the gateway passes gets its 502 or 503 (engine not answering) and one it refuses its 400 naming the field and the limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from documents.sections.serve import ServeConfig
from workloads.serve.gateway.app import build_gateway
from workloads.serve.launcher.engine_plan import base_route

KEY = "bodies-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def client(smollm2_base_dir: Path):
    route = base_route(smollm2_base_dir, "http://127.0.0.1:9", ServeConfig(engine="vllm"), "vllm")
    with TestClient(build_gateway([route], KEY)) as client:
        yield client


@pytest.fixture(scope="module")
def vocab_size(smollm2_base_dir: Path) -> int:
    """The model's own word (config.json), not the gateway's tokenizer count."""
    return json.loads((smollm2_base_dir / "config.json").read_text())["vocab_size"]


def refusal(client: TestClient, path: str, body: dict) -> str:
    reply = client.post(path, headers=HEADERS, json={"model": "base", **body})
    assert reply.status_code == 400, (path, body, reply.status_code, reply.text)
    return reply.json()["error"]["message"]


@pytest.mark.parametrize("body,named", [
    ({"prompt": "hi", "typo_field": 1}, "typo_field: not accepted by POST /v1/completions"),
    ({"prompt": "hi", "suffix": "x"}, "suffix: not accepted"),
    ({"prompt": "hi", "best_of": 1000}, "best_of: 1000 asked; this endpoint returns one choice per prompt"),
    ({"prompt": "hi", "n": 3}, "n: 3 asked"),
    ({"prompt": "hi", "logprobs": 50}, "logprobs: Input should be less than or equal to 20"),
    ({"prompt": "hi", "temperature": 9}, "temperature: Input should be less than or equal to 2"),
    ({"prompt": "hi", "stream": "yes"}, "stream: Input should be a valid boolean"),
    ({"prompt": ["hi"] * 65}, "65 prompts, over this endpoint's limit of 64 per request"),
    ({"prompt": []}, "at least one prompt"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
])
def test_completions_fields_are_checked_or_refused_naming_them(client: TestClient, body: dict, named: str) -> None:
    assert named in refusal(client, "/v1/completions", body)


@pytest.mark.parametrize("path,body", [("/v1/completions", {"prompt": "hi"}),
                                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})])
def test_max_tokens_over_the_configured_limit_is_refused(client: TestClient, path: str, body: dict) -> None:
    limit = ServeConfig().max_tokens_limit  # the gateway's default Limits
    assert f"max_tokens {limit + 1} is over this endpoint's limit of {limit}" in refusal(
        client, path, {**body, "max_tokens": limit + 1})


def test_token_ids_past_the_vocabulary_are_refused(client: TestClient, vocab_size: int) -> None:
    limit = f"is outside the vocabulary (ids 0 to {vocab_size - 1})"
    assert f"prompt: token id {vocab_size} {limit}" in refusal(client, "/v1/completions", {"prompt": [[1, vocab_size]]})
    assert f"tokens: token id {10**9} {limit}" in refusal(client, "/detokenize", {"tokens": [1, 10**9]})
    assert "tokens.0: Input should be a valid integer" in refusal(client, "/detokenize", {"tokens": [1e9]})
    assert "tokens.0: Input should be greater than or equal to 0" in refusal(client, "/detokenize", {"tokens": [-1]})


def test_tokenize_takes_a_prompt_or_messages_and_no_server_setting(client: TestClient) -> None:
    assert "chat_template: not accepted by POST /tokenize" in refusal(
        client, "/tokenize", {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ 1 }}"})
    assert "prompt or messages: give exactly one" in refusal(
        client, "/tokenize", {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]})
    assert "prompt or messages" in refusal(client, "/tokenize", {})


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "top_k": 5, "n": 1, "logprobs": 2}),
    ("/v1/completions", {"prompt": [[1, 2, 3], [4]], "best_of": 1}),
    ("/tokenize", {"prompt": "hi", "add_special_tokens": False}),
    ("/detokenize", {"tokens": [0, 1, 2]}),
])
def test_a_body_within_the_limits_goes_on_to_vllm(client: TestClient, path: str, body: dict) -> None:
    reply = client.post(path, headers=HEADERS, json={"model": "base", **body})
    assert (reply.status_code, reply.json()["error"]["code"]) in ((502, "engine_unreachable"),
                                                                   (503, "engine_unavailable")), reply.text
