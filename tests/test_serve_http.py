"""The endpoint through real HTTP: gateway + `transformers serve` engines on SmolLM2 (base and merged fine-tuned)."""

from __future__ import annotations

import httpx
import pytest
from openai import AuthenticationError, OpenAI

pytestmark = pytest.mark.slow


def test_health_is_open_and_reports_every_model(served) -> None:
    reply = httpx.get(served.api.removesuffix("/v1") + "/health", timeout=10)
    assert reply.status_code == 200
    assert reply.json() == {"status": "ok", "models": {"base": "ok", "finetuned": "ok"}}


def test_models_need_the_key(served) -> None:
    assert httpx.get(f"{served.api}/models", timeout=10).status_code == 401
    wrong = httpx.get(f"{served.api}/models", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=served.api, api_key="wrong").models.list()
    ids = {m.id: m for m in OpenAI(base_url=served.api, api_key=served.api_key).models.list().data}
    assert set(ids) == {"base", "finetuned"}


def test_streaming_chat_with_the_openai_client(served) -> None:
    client = OpenAI(base_url=served.api, api_key=served.api_key)
    stream = client.chat.completions.create(
        model="finetuned", messages=[{"role": "user", "content": "What is a bond?"}],
        stream=True, max_tokens=8, temperature=0.0,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 2 and text.strip()
    assert {c.model for c in chunks} == {"finetuned"}
    assert served.run.merged_dir.name not in str([c.model_dump() for c in chunks])


def test_non_streaming_chat_on_base_and_unknown_model(served) -> None:
    headers = {"Authorization": f"Bearer {served.api_key}"}
    body = {"model": "base", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6}
    reply = httpx.post(f"{served.api}/chat/completions", json=body, headers=headers, timeout=300)
    assert reply.status_code == 200, reply.text
    document = reply.json()
    assert document["model"] == "base" and document["choices"][0]["message"]["content"].strip()
    missing = httpx.post(f"{served.api}/chat/completions", json={**body, "model": "gpt-4"}, headers=headers, timeout=30)
    assert missing.status_code == 404 and "finetuned" in missing.json()["error"]["message"]
    assert httpx.post(f"{served.api}/chat/completions", json=body, timeout=30).status_code == 401
    assert "Bearer" not in served.log.read_text() and served.api_key not in served.log.read_text()


def test_ignore_eos_generates_max_tokens_whatever_the_model_says(served) -> None:
    """Issue 42, item 12: a benchmark compares equal output lengths (vLLM's `ignore_eos`). transformers serve
    refuses a field it does not know (422), so the gateway gives it a generation config without an
    end-of-sequence token; a value that is no boolean is refused by name."""
    from workloads.serve.clients.openai_client import stream_chat

    url, headers = f"{served.api}/chat/completions", {"Authorization": f"Bearer {served.api_key}"}
    body = {"model": "base", "messages": [{"role": "user", "content": "Reply with one word: is the sky blue?"}],
            "max_tokens": 96, "temperature": 0.0}  # SmolLM2 answers this in about 9 tokens
    natural = httpx.post(url, json=body, headers=headers, timeout=300).json()
    assert natural["choices"][0]["finish_reason"] == "stop" and natural["usage"]["completion_tokens"] < 96, natural
    forced = httpx.post(url, json={**body, "ignore_eos": True}, headers=headers, timeout=300)
    assert forced.status_code == 200, forced.text
    assert forced.json()["choices"][0]["finish_reason"] == "length"
    assert forced.json()["usage"]["completion_tokens"] == 96, forced.json()["usage"]
    *_, streamed = stream_chat(served.api, "finetuned", body["messages"], served.api_key, max_tokens=40, ignore_eos=True)
    assert streamed.completion_tokens == 40, streamed
    bad = httpx.post(url, json={**body, "ignore_eos": "yes"}, headers=headers, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("ignore_eos:"), bad.text
