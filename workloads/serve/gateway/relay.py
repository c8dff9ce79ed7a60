"""Relaying a validated request to its engine and the reply back: streamed through under the public model name,
collected into one document from a stream the client did not ask for, or the engine's own document (vLLM's
non-streaming reply). A client who hangs up closes the engine's reply and the engine cancels the generation; a
server that stops ends what is still running with an error."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from workloads.serve.gateway.state import Gateway, SpeedMeter
from workloads.serve.gateway.stream_end import SHUTDOWN_CODE, SHUTDOWN_MESSAGE, ended_like_openai, until_closing
from workloads.serve.http_shared import Refused, error
from workloads.serve.route import Route


DRAIN_LIMIT = 256 << 20


T = TypeVar("T")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past `limit` bytes: by its Content-Length before reading, else while reading.
    A refused body is drained (not kept) so that the client gets the 413 instead of a broken connection."""
    declared = request.headers.get("content-length", "")
    too_big = declared.isdigit() and int(declared) > limit
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            too_big = True
        if too_big:
            if size > DRAIN_LIMIT:
                break
            continue
        chunks.append(chunk)
    if too_big:
        raise Refused(413, f"request body is over the limit of {limit} bytes", "body_too_large")
    return b"".join(chunks)


async def until_disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body has been read, so the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def rename_sse_line(line: str, name: str) -> str:
    """Replace `model` in one `data: {...}` SSE line; other lines pass unchanged."""
    if not line.startswith("data:"):
        return line
    payload = line[5:].strip()
    if not payload.startswith("{"):
        return line
    try:
        chunk = json.loads(payload)
    except ValueError:
        return line
    if "model" in chunk:
        chunk["model"] = name
    return "data: " + json.dumps(chunk, ensure_ascii=False)


def collect_stream(lines: list[str], name: str) -> dict[str, Any]:
    """A chat.completion document from the SSE chunks of one streamed reply."""
    content, tool_calls = [], []
    document: dict[str, Any] = {"object": "chat.completion", "model": name}
    finish_reason, usage = None, None
    for line in lines:
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        chunk = json.loads(line[5:])
        if "error" in chunk:
            raise Refused(502, f"engine error: {chunk['error']}", "engine_error")
        document.setdefault("id", chunk.get("id"))
        document.setdefault("created", chunk.get("created"))
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            tool_calls += delta.get("tool_calls") or []
            finish_reason = choice.get("finish_reason") or finish_reason
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if tool_calls:
        message["tool_calls"] = tool_calls
    document["choices"] = [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}]
    if usage:
        document["usage"] = usage
    return document


async def forward(request: Request, gateway: Gateway, route: Route, path: str, body: dict[str, Any],
                  client_streams: bool) -> Response:
    """Send a validated body to the route's engine and answer with its reply: streamed through, collected from
    a stream the client did not ask for, or the engine's own document."""
    if (state := gateway.engine_state(route.url)) is not None:
        return engine_unavailable(route.name, state)
    started = time.monotonic()
    upstream = gateway.client.build_request("POST", f"{route.url}{path}", json=body)
    try:
        reply = await gateway.client.send(upstream, stream=True)
    except httpx.ConnectError:
        return engine_unavailable(route.name, "not answering")
    except httpx.HTTPError as exc:
        return error(502, f"engine for {route.name!r} is unreachable: {type(exc).__name__}", "engine_unreachable")
    if reply.status_code != 200:
        return await engine_answer(reply)
    meter = gateway.meter(route.name)
    if client_streams:
        return StreamingResponse(ended_like_openai(until_closing(relay_stream(reply, route, meter, started),
                                                                 gateway.closing), route.name),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    whole = whole_reply if body.get("stream") else engine_document
    return await whole(request, reply, route, meter, started, gateway.closing)


RETRY_AFTER_S = 5


def engine_unavailable(name: str, state: str) -> JSONResponse:
    """503 with Retry-After while a listed name's engine restarts (and reloads the served set): never a 404."""
    response = error(503, f"the engine serving {name!r} is {state}; retry shortly", "engine_unavailable")
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


async def engine_answer(reply: httpx.Response) -> Response:
    """The engine's own answer (a refusal, or a document), passed on."""
    content = await reply.aread()
    await reply.aclose()
    try:
        return JSONResponse(json.loads(content), status_code=reply.status_code)
    except ValueError:
        return Response(content, status_code=reply.status_code, media_type=reply.headers.get("content-type"))


CONTENT = re.compile(r'"content":\s*"[^"]')


def has_content(line: str) -> bool:
    """Whether an SSE line carries generated text (one streamed chunk: about one token)."""
    return line.startswith("data:") and CONTENT.search(line) is not None


async def relay_stream(reply: httpx.Response, route: Route, meter: SpeedMeter, started: float) -> AsyncIterator[str]:
    """The engine's SSE lines with the public model name; closing it closes the engine's stream."""
    tokens, first = 0, None
    try:
        async for line in reply.aiter_lines():
            if has_content(line):
                tokens += 1
                first = first if first is not None else time.monotonic() - started
            yield rename_sse_line(line, route.name) + "\n"
    finally:
        await reply.aclose()
        meter.record(tokens, first, time.monotonic() - started)


async def until_answered(request: Request, reply: httpx.Response, closing: asyncio.Event,
                         reading: Awaitable[T]) -> T | Response:
    """What `reading` gives, unless the client hangs up first (then the engine's reply is closed: the engine
    cancels the generation, and nobody is answered) or the server stops (then it is closed and 503 answered)."""
    task = asyncio.ensure_future(reading)
    gone = asyncio.ensure_future(until_disconnected(request))
    stopped = asyncio.ensure_future(closing.wait())
    try:
        finished, _ = await asyncio.wait({task, gone, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, gone, stopped):
            pending.cancel()
        await reply.aclose()
    if task in finished:
        return task.result()
    if gone in finished:
        return Response(status_code=499)
    return JSONResponse({"error": {"message": SHUTDOWN_MESSAGE, "type": "server_error", "code": SHUTDOWN_CODE}},
                        status_code=503)


async def whole_reply(request: Request, reply: httpx.Response, route: Route, meter: SpeedMeter,
                      started: float, closing: asyncio.Event) -> Response:
    """One chat.completion document collected from the engine's stream (engines asked for a stream)."""
    first: list[float] = []

    async def lines() -> list[str]:
        read = []
        async for line in reply.aiter_lines():
            if not first and has_content(line):
                first.append(time.monotonic() - started)
            read.append(line)
        return read

    read = await until_answered(request, reply, closing, lines())
    if isinstance(read, Response):
        return read
    try:
        document = collect_stream(read, route.name)
    except Refused as refused:
        return error(refused.status, str(refused), refused.code)
    except (ValueError, httpx.HTTPError) as exc:
        return error(502, f"engine for {route.name!r} sent a broken stream: {exc}", "engine_error")
    tokens = (document.get("usage") or {}).get("completion_tokens")
    meter.record(tokens if isinstance(tokens, int) else sum(has_content(line) for line in read),
                 first[0] if first else None, time.monotonic() - started)
    return JSONResponse(document)


async def engine_document(request: Request, reply: httpx.Response, route: Route, meter: SpeedMeter,
                          started: float, closing: asyncio.Event) -> Response:
    """vLLM's non-streaming reply as vLLM gives it (logprobs, whole tool calls), under the public model name."""
    content = await until_answered(request, reply, closing, reply.aread())
    if isinstance(content, Response):
        return content
    try:
        document = json.loads(content)
    except ValueError as exc:
        return error(502, f"engine for {route.name!r} sent a broken reply: {exc}", "engine_error")
    document["model"] = route.name
    tokens = (document.get("usage") or {}).get("completion_tokens")
    meter.record(tokens if isinstance(tokens, int) else 0, None, time.monotonic() - started)
    return JSONResponse(document)
