"""How every stream the gateway relays ends: as OpenAI's API and vLLM end theirs, with `data: [DONE]` last, and
with an error event before it when the engine's stream breaks midway (an engine that died) or the server stops it
(SIGTERM, after the grace period)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx

DONE = "data: [DONE]"


class ShuttingDown(Exception):
    """The server is stopping and the grace period for requests in flight is over."""


async def until_closing(lines: AsyncIterator[str], closing: asyncio.Event) -> AsyncIterator[str]:
    """`lines` until they end, or ShuttingDown once `closing` is set (the line being awaited is cancelled).

    Each line is awaited in a task of its own, so when this generator is cancelled or closed (the client hung up:
    the response's stream is cancelled) a line may be in flight there: that task is cancelled, which ends `lines`
    inside it (its own `finally` closes the engine's reply, so the engine stops the generation). Closing `lines`
    from here instead would fail while that task runs it ("already running") and leave the engine's reply open
    until the garbage collector found it."""
    stop = asyncio.ensure_future(closing.wait())
    step: asyncio.Future[str] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(lines))
            await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
                raise ShuttingDown
            try:
                line = step.result()
            except StopAsyncIteration:
                return
            yield line
    finally:
        stop.cancel()
        if step is not None and not step.done():
            step.cancel()
        else:
            await lines.aclose()


SHUTDOWN_MESSAGE = "the server is shutting down; this request was stopped at the end of its grace period"
SHUTDOWN_CODE = "server_shutting_down"


def sse_error(message: str, code: str) -> str:
    """One SSE event with an OpenAI error object, as a stream reports a failure after its 200."""
    return "data: " + json.dumps({"error": {"message": message, "type": "server_error", "code": code}}) + "\n\n"


async def ended_like_openai(lines: AsyncIterator[str], name: str) -> AsyncIterator[str]:
    """`lines` (SSE lines, each with its newline) passed on, then an error event if they broke off with an HTTP
    error or ShuttingDown, then `data: [DONE]` unless the engine sent it (it is never doubled)."""
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
        except ShuttingDown:
            yield ("\n" if open_event else "") + sse_error(SHUTDOWN_MESSAGE, SHUTDOWN_CODE)
            open_event = False
        if not done:
            yield ("\n" if open_event else "") + f"{DONE}\n\n"
    finally:
        await lines.aclose()
