"""The gateway's OpenAI routes: `GET /health` (open), `GET /v1/models` and `POST /v1/chat/completions`, each request
validated (shape, size, max_tokens, prompt length against the route's token budget, fields the route's engine
honours) before it is relayed to an engine (workloads.serve.gateway.relay)."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from documents.sections.serve import shown
from workloads.serve.gateway.relay import forward, read_body
from workloads.serve.gateway.state import Gateway, denied, gateway_of
from workloads.serve.http_shared import Refused, error
from workloads.serve.request import ChatRequest, RequestError, read_chat_request, refused_field
from workloads.serve.route import Route


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
        raise Refused(404, f"model {shown(chat.model)} is not served; choose one of {sorted(gateway.routes)}", "model_not_found")
    if problem := refused_field(chat, route.engine):
        raise Refused(400, problem, "unsupported_field")
    asked = chat.asked_tokens
    granted = limits.granted(asked)
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
