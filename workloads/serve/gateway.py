"""The public face of the endpoint: API-key check, request validation, model names (base and each adapter),
routing to engine processes, runtime adapter load/unload (admin, API key always) and per-name speed figures.

Engines (`transformers serve`, the peft engine, vLLM) listen on loopback ports; the gateway streams their
responses through, replacing the engine's internal model id (a folder path) with the public name. Every request
is validated (shape, size, max_tokens, prompt length, fields the route's engine honours) before it reaches an
engine. Upstream, the gateway asks the transformers and peft engines for a stream and collects a non-streaming
reply from it; vLLM answers a non-streaming request itself (its logprobs and tool calls whole). Either way a
client who hangs up closes the engine's reply and the engine cancels the generation.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from documents.adapter_registry import AdapterEntry, AdapterSpeed
from documents.sections.serve import ServeConfig, model_name_problem
from documents.text_input import TextInputError, load_json
from workloads.serve.auth import bearer_matches
from workloads.serve.budget import PromptCounter, TokenBudget
from workloads.serve.request import ChatRequest, RequestError, read_chat_request, refused_field
from workloads.serve.stream_end import SHUTDOWN_CODE, SHUTDOWN_MESSAGE, ended_like_openai, until_closing

DRAIN_LIMIT = 256 << 20
T = TypeVar("T")


@dataclass(frozen=True)
class Route:
    name: str
    url: str
    upstream: str
    kind: str
    tokenizer: str | None = None
    budget: TokenBudget | None = None
    adapter: AdapterEntry | None = None
    root: str | None = None
    """the folder served (vLLM's card `root`)"""
    parent: str | None = None
    """an adapter's base model name (vLLM's card `parent`)"""
    engine: str = "transformers"
    """the engine process behind it: transformers, peft or vllm (what request fields it honours)"""
    ignore_eos_body: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})
    """the body fields that make the route's engine ignore the end-of-sequence token (vLLM's and the peft
    engine's `ignore_eos`; transformers serve takes a whole `generation_config` instead)"""


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (ServeConfig.max_tokens_limit, max_body_bytes)."""

    max_tokens: int = ServeConfig.model_fields["max_tokens_limit"].default
    max_body_bytes: int = 1 << 20


class Refused(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": code}}, status_code=status)


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


@dataclass(frozen=True)
class AdapterHost:
    """The engine that loads adapters at runtime, and how a stored run becomes an entry and a route.
    `resolve(name, run_id)` raises ValueError (LookupError for an unknown run) with the reason to refuse."""

    url: str
    resolve: Callable[[str, str], AdapterEntry]
    route: Callable[[AdapterEntry], Route]
    run_of_path: Callable[[str], str | None] = lambda path: None
    """the stored run whose adapter folder in the store is `path` (vLLM's lora_path), else None"""


@dataclass
class SpeedMeter:
    """Requests, output tokens, generation time and time to first token of one served name."""

    requests: int = 0
    tokens: int = 0
    generating_s: float = 0.0
    first_token_s: list[float] = field(default_factory=list)

    def record(self, tokens: int, ttft_s: float | None, total_s: float) -> None:
        self.requests += 1
        self.tokens += tokens
        self.generating_s += total_s
        if ttft_s is not None:
            self.first_token_s = [*self.first_token_s[-255:], ttft_s]

    def speed(self) -> AdapterSpeed:
        ttft = sorted(self.first_token_s)
        return AdapterSpeed(requests=self.requests, completion_tokens=self.tokens,
                            tokens_per_second=self.tokens / self.generating_s if self.generating_s > 0 else None,
                            time_to_first_token_s=ttft[len(ttft) // 2] if ttft else None)


@dataclass
class Gateway:
    """What the routes share: the served models by name, the limits, the key and one HTTP client to the engines.
    `engine_state(url)` is the supervisor's word on an engine ("restarting", "failed"), or None."""

    routes: dict[str, Route]
    api_key: str | None
    limits: Limits
    client: httpx.AsyncClient
    engine_state: Callable[[str], str | None]
    counters: dict[str, PromptCounter] = field(default_factory=dict)
    """by tokenizer folder"""
    created: int = field(default_factory=lambda: int(time.time()))
    adapter_host: AdapterHost | None = None
    meters: dict[str, SpeedMeter] = field(default_factory=dict)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    """set when the server stops and the grace period for requests in flight is over: they end with an error."""
    on_change: Callable[[], None] = lambda: None
    """called after every change of the served set (the launcher persists it)"""

    def close_after(self, grace_s: float) -> None:
        """Called as the server begins to stop: requests still running in `grace_s` seconds are ended."""
        asyncio.get_running_loop().call_later(grace_s, self.closing.set)

    def meter(self, name: str) -> SpeedMeter:
        return self.meters.setdefault(name, SpeedMeter())

    def speeds(self) -> dict[str, AdapterSpeed]:
        """Each name's figures so far (names unloaded since keep theirs)."""
        return {name: meter.speed() for name, meter in self.meters.items()}


def gateway_of(request: Request) -> Gateway:
    return request.app.state.gateway


def denied(gateway: Gateway, request: Request) -> JSONResponse | None:
    """401 unless the request carries the API key (when one is set)."""
    if gateway.api_key and not bearer_matches(request.headers.get("authorization"), gateway.api_key):
        return error(401, "missing or wrong API key (send Authorization: Bearer <key>)", "invalid_api_key")
    return None


async def health(request: Request) -> JSONResponse:
    """GET /health (open): each model's engine state; 503 unless every one is ok."""
    gateway = gateway_of(request)
    routes = list(gateway.routes.values())
    states: dict[str, str] = {}
    for url in sorted({r.url for r in routes}):
        state = gateway.engine_state(url)
        if state is None:
            try:
                answer = await gateway.client.get(f"{url}/health", timeout=5.0)
                state = "ok" if answer.status_code == 200 else "down"
            except httpx.HTTPError:
                state = "down"
        for r in routes:
            if r.url == url:
                states[r.name] = state
    healthy = all(s == "ok" for s in states.values())
    return JSONResponse({"status": "ok" if healthy else "unhealthy", "models": states}, status_code=200 if healthy else 503)


async def list_models(request: Request) -> JSONResponse:
    """GET /v1/models: every served name."""
    gateway = gateway_of(request)
    if refusal := denied(gateway, request):
        return refusal
    return JSONResponse({"object": "list", "data": [model_card(gateway, r) for r in gateway.routes.values()]})


def model_card(gateway: Gateway, route: Route) -> dict[str, Any]:
    """A /v1/models entry with vLLM's `root` and `parent`; an adapter's names its run (and the stack that ran it),
    base and evaluation."""
    card: dict[str, Any] = {"id": route.name, "object": "model", "created": gateway.created,
                            "owned_by": "soperator-finetune", "root": route.root or route.name,
                            "parent": route.parent, "kind": route.kind}
    if route.adapter is not None:
        card.update(route.adapter.model_dump(include={"run_id", "run_name", "stack", "rank", "adapter_sha256",
                                                      "base_model_sha256", "dataset_sha256", "evaluation"}))
    return card


async def upstream_body(gateway: Gateway, request: Request) -> tuple[Route, ChatRequest, dict[str, Any]]:
    """The validated request, its route and the body for the engine (always streamed, max_tokens granted)."""
    limits = gateway.limits
    raw = await read_body(request, limits.max_body_bytes)
    try:
        chat = read_chat_request(raw, request.headers.get("content-type"))
    except RequestError as problem:
        raise Refused(problem.status, str(problem), problem.code) from None
    route = gateway.routes.get(chat.model)
    if route is None:
        raise Refused(404, f"model {chat.model!r} is not served; choose one of {sorted(gateway.routes)}", "model_not_found")
    if problem := refused_field(chat, route.engine):
        raise Refused(400, problem, "unsupported_field")
    asked = chat.asked_tokens
    if asked is not None and asked > limits.max_tokens:
        raise Refused(400, f"max_tokens {asked} is over this endpoint's limit of {limits.max_tokens}", "max_tokens_too_large")
    granted = asked or limits.max_tokens
    if route.tokenizer in gateway.counters and route.budget:
        messages = [{**m.model_dump(exclude_none=True), "content": m.text()} for m in chat.messages]
        prompt = await run_in_threadpool(gateway.counters[route.tokenizer].count, messages)
        budget = route.budget
        if prompt >= budget.tokens:
            raise Refused(400, f"prompt is {prompt} tokens; {budget.reason} holds {budget.tokens} tokens for "
                               "prompt and reply together", "context_length_exceeded")
        room = budget.tokens - prompt
        if asked is not None and asked > room:
            raise Refused(400, f"prompt ({prompt} tokens) plus max_tokens ({asked}) is over {budget.reason} of "
                               f"{budget.tokens} tokens; ask for at most {room}", "context_length_exceeded")
        granted = min(granted, room)
    body = chat.model_dump(exclude_none=True, exclude={"max_completion_tokens", "n", "ignore_eos"})
    streamed = chat.stream or route.engine != "vllm"
    body.update(model=route.upstream, max_tokens=granted, stream=streamed,
                **(route.ignore_eos_body if chat.ignore_eos else {}))
    if not chat.stream and streamed:
        body["stream_options"] = {"include_usage": True}
    return route, chat, body


async def chat_completions(request: Request) -> Response:
    """POST /v1/chat/completions: validate, send to the route's engine, stream back or collect one document."""
    gateway = gateway_of(request)
    if refusal := denied(gateway, request):
        return refusal
    try:
        route, parsed, body = await upstream_body(gateway, request)
    except Refused as refused:
        return error(refused.status, str(refused), refused.code)
    return await forward(request, gateway, route, "/v1/chat/completions", body, parsed.stream)


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


def admin_denied(gateway: Gateway, request: Request) -> JSONResponse | None:
    """Admin routes need the API key, also on loopback: without one configured they are closed."""
    if not gateway.api_key:
        return error(403, "admin routes need an API key: start the server with one (serve.api_key_env)", "admin_closed")
    return denied(gateway, request)


@dataclass(frozen=True)
class BodyErrors:
    """How an admin API names a bad body: its error codes and its message for missing fields."""

    not_json: str
    invalid: str
    missing: Callable[[list[str]], str]
    not_object: str | None = None  # None: a body that is no object is said as every field missing


ADMIN_BODY_ERRORS = BodyErrors("invalid_json", "invalid_request",
                               lambda missing: f"{', '.join(missing)}: required, a non-empty string",
                               "request body must be a JSON object")


async def string_fields(request: Request, fields: tuple[str, ...], errors: BodyErrors) -> dict[str, str]:
    """The body's JSON object's `fields`, each a non-empty string; anything else is refused in `errors`' terms."""
    raw = await read_body(request, 64 << 10)
    try:
        document = load_json(raw, "request body", standard=True)
    except TextInputError:
        raise Refused(400, "request body is not JSON", errors.not_json) from None
    if not isinstance(document, dict):
        raise Refused(400, errors.not_object or errors.missing(list(fields)), errors.invalid)
    missing = [f for f in fields if not isinstance(document.get(f), str) or not document[f]]
    if missing:
        raise Refused(400, errors.missing(missing), errors.invalid)
    return {f: document[f] for f in fields}


async def engine_admin(gateway: Gateway, path: str, body: dict[str, str]) -> None:
    """POST one of the engine's dynamic LoRA routes; its refusal becomes a 400 naming why."""
    assert gateway.adapter_host is not None
    try:
        answer = await gateway.client.post(f"{gateway.adapter_host.url}{path}", json=body, timeout=300.0)
    except httpx.HTTPError as exc:
        raise Refused(502, f"engine unreachable: {type(exc).__name__}", "engine_unreachable") from None
    if answer.status_code != 200:
        try:
            reason = answer.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = answer.text[:500]
        raise Refused(400, f"the engine refused: {reason}", "engine_refused")


async def load_adapter(request: Request) -> JSONResponse:
    """POST /admin/adapters {"name", "run_id"}: load a stored run's adapter and serve it under `name`."""
    gateway = gateway_of(request)
    if refusal := admin_denied(gateway, request):
        return refusal
    if gateway.adapter_host is None:
        return error(400, "this engine does not load adapters at runtime", "no_adapter_engine")
    try:
        body = await string_fields(request, ("name", "run_id"), ADMIN_BODY_ERRORS)
        name = body["name"]
        if problem := model_name_problem(name):
            raise Refused(400, f"name {problem}", "invalid_request")
        if name in gateway.routes:
            raise Refused(409, f"model {name!r} is already served", "model_exists")
        try:
            entry = gateway.adapter_host.resolve(name, body["run_id"])
        except LookupError as missing:
            raise Refused(404, str(missing).strip("'\""), "run_not_found") from None
        except ValueError as problem:
            raise Refused(400, str(problem), "adapter_refused") from None
        await engine_admin(gateway, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": entry.adapter_dir})
    except Refused as refused:
        return error(refused.status, str(refused), refused.code)
    route = gateway.adapter_host.route(entry)
    if route.tokenizer and route.budget:
        gateway.counters.setdefault(route.tokenizer, PromptCounter(Path(route.tokenizer)))
    gateway.routes[name] = route
    gateway.on_change()
    return JSONResponse(model_card(gateway, route))


async def unload_adapter(request: Request) -> JSONResponse:
    """DELETE /admin/adapters/{name}: stop serving an adapter. New requests for it get 404 at once; the ones
    the engine already holds finish (nothing in flight is cut or waited for)."""
    gateway = gateway_of(request)
    if refusal := admin_denied(gateway, request):
        return refusal
    name = request.path_params["name"]
    route = gateway.routes.get(name)
    if route is None or route.adapter is None or gateway.adapter_host is None:
        adapters = sorted(n for n, r in gateway.routes.items() if r.adapter is not None)
        return error(404, f"no adapter {name!r} is served; adapters: {adapters}", "model_not_found")
    del gateway.routes[name]
    try:
        await engine_admin(gateway, "/v1/unload_lora_adapter", {"lora_name": route.upstream})
    except Refused as refused:
        gateway.routes[name] = route
        return error(refused.status, str(refused), refused.code)
    gateway.on_change()
    return JSONResponse({"id": name, "unloaded": True})
