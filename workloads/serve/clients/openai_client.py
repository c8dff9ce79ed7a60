"""A small streaming client for any OpenAI-compatible endpoint (used by the chat UI and the benchmark)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx


class EndpointError(RuntimeError):
    """The endpoint refused or failed a request; the message carries its status and error text."""


@dataclass
class StreamState:
    """Progress of one streamed answer; times in seconds from the request being sent."""

    text: str = ""
    chunks: int = 0
    ttft_s: float | None = None
    total_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    """the output tokens the endpoint counted (its usage), once the stream has ended"""


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _raise_for(reply: httpx.Response, what: str) -> None:
    if reply.status_code != 200:
        reply.read()
        try:
            message = reply.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = reply.text[:300]
        raise EndpointError(f"{what}: HTTP {reply.status_code}: {message}")


def list_models(api: str, api_key: str | None = None, timeout: float = 10.0) -> list[str]:
    reply = httpx.get(f"{api.rstrip('/')}/models", headers=_headers(api_key), timeout=timeout)
    _raise_for(reply, f"GET {api}/models")
    return [m["id"] for m in reply.json()["data"]]


def stream_chat(
    api: str,
    model: str,
    messages: list[dict[str, str]],
    api_key: str | None = None,
    max_tokens: int = 256,
    timeout: float = 600.0,
    client: httpx.Client | None = None,
    ignore_eos: bool = False,
) -> Iterator[StreamState]:
    """POST /chat/completions with stream=true; yields the state after every content delta, then once at the end.
    With `ignore_eos` (vLLM's field) the endpoint generates `max_tokens` tokens whatever the model says."""
    body = {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": 0.0,
            "stream_options": {"include_usage": True}, **({"ignore_eos": True} if ignore_eos else {})}
    state = StreamState()
    owned = client is None
    client = client or httpx.Client(timeout=timeout)
    start = time.perf_counter()
    try:
        with client.stream("POST", f"{api.rstrip('/')}/chat/completions", json=body, headers=_headers(api_key)) as reply:
            _raise_for(reply, f"POST {api}/chat/completions")
            for line in reply.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    raise EndpointError(f"stream error: {chunk['error']}")
                state.completion_tokens = (chunk.get("usage") or {}).get("completion_tokens", state.completion_tokens)
                delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
                if delta:
                    now = time.perf_counter() - start
                    if state.ttft_s is None:
                        state.ttft_s = now
                    state.text += delta
                    state.chunks += 1
                    state.chunk_times.append(now)
                    yield state
    finally:
        if owned:
            client.close()
    state.total_s = time.perf_counter() - start
    yield state
