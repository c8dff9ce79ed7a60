"""How every stream the gateway relays ends: as OpenAI's API and vLLM end theirs, with `data: [DONE]` last, and
with an error event before it when the engine's stream breaks midway (an engine that died)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

DONE = "data: [DONE]"


def sse_error(message: str, code: str) -> str:
    """One SSE event with an OpenAI error object, as a stream reports a failure after its 200."""
    return "data: " + json.dumps({"error": {"message": message, "type": "server_error", "code": code}}) + "\n\n"


async def ended_like_openai(lines: AsyncIterator[str], name: str) -> AsyncIterator[str]:
    """`lines` (SSE lines, each with its newline) passed on, then an error event if they broke off with an HTTP
    error, then `data: [DONE]` unless the engine sent it (it is never doubled)."""
    done, open_event = False, False
    try:
        try:
            async for line in lines:
                done = done or line.strip() == DONE
                open_event = line.strip() != ""
                yield line
        except httpx.HTTPError as exc:
            yield ("\n" if open_event else "") + sse_error(
                f"engine for {name!r} broke the stream: {type(exc).__name__}", "engine_error")
            open_event = False
        if not done:
            yield ("\n" if open_event else "") + f"{DONE}\n\n"
    finally:
        await lines.aclose()
