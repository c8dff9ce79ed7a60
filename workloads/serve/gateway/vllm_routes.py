"""vLLM's routes beyond chat at the gateway, so that a client written for vLLM's OpenAI server works unchanged:

    POST /v1/completions   text completion (lm-eval's `local-completions`, `client.completions.create`)
    POST /tokenize         POST /detokenize
    GET  /version          the engine's version (open, as vLLM's)
    GET  /metrics          the engine's Prometheus series (`vllm:*`), API key required when one is set: vLLM's own,
                           or the peft engine's under vLLM's names (workloads.serve.engine.metrics)

A model served by another engine gets a 400 naming its engine; with no vLLM engine behind the gateway /version
answers 404, and /metrics with neither a vLLM nor a peft engine (`transformers serve` exports no such series).
Bodies are validated as chat's are: the API key, the size limit, the model name (mapped to the engine's), every
field checked or forwarded or refused naming it, token ids within the vocabulary
(workloads.serve.gateway.vllm_requests), `max_tokens` within the configured limit (left out: the limit; vLLM
counts the prompt against its context itself and refuses what overflows it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from documents.sections.serve import shown
from documents.text_input import TextInputError, load_json
from workloads.serve.gateway.prompt_counter import PromptCounter
from workloads.serve.gateway.relay import engine_answer, engine_unavailable, forward, read_body
from workloads.serve.gateway.state import Gateway, denied, gateway_of
from workloads.serve.gateway.vllm_requests import checked_completion, checked_detokenize, checked_tokenize
from workloads.serve.http_shared import Refused, error
from workloads.serve.request import RequestError
from workloads.serve.route import Route

VLLM = "vllm"
METRICS_ENGINES = (VLLM, "peft")
"""the engines whose /metrics has vLLM's series"""


async def vllm_body(gateway: Gateway, request: Request, what: str) -> tuple[Route, dict[str, Any]]:
    """The JSON body with its model served by a vLLM engine, renamed to the engine's name for it."""
    raw = await read_body(request, gateway.limits.max_body_bytes)
    try:
        document = load_json(raw, "request body", standard=True)
    except TextInputError as problem:
        raise Refused(400, str(problem), "invalid_json") from None
    if not isinstance(document, dict) or not isinstance(document.get("model"), str):
        raise Refused(400, "model: required, a served model's name", "invalid_request")
    route = gateway.routes.get(document["model"])
    if route is None:
        raise Refused(404, f"model {shown(document['model'])} is not served; choose one of {sorted(gateway.routes)}",
                      "model_not_found")
    if route.engine != VLLM:
        raise Refused(400, f"{what} is served by engine vllm; model {route.name!r} is on engine {route.engine}",
                      "unsupported_route")
    return route, {**document, "model": route.upstream}


async def vocabulary(gateway: Gateway, route: Route) -> int | None:
    """The size of the route's tokenizer's vocabulary, None where the gateway has no tokenizer for it."""
    if not route.tokenizer:
        return None
    counter = gateway.counters.setdefault(route.tokenizer, PromptCounter(Path(route.tokenizer)))
    return await run_in_threadpool(counter.vocabulary)


async def completions(request: Request) -> Response:
    gateway = gateway_of(request)
    if refusal := denied(gateway, request):
        return refusal
    try:
        route, body = await vllm_body(gateway, request, "POST /v1/completions")
        checked_completion(body, await vocabulary(gateway, route))
        body["max_tokens"] = gateway.limits.granted(body.get("max_tokens"))
    except Refused as refused:
        return error(refused.status, str(refused), refused.code)
    except RequestError as problem:
        return error(problem.status, str(problem), problem.code)
    return await forward(request, gateway, route, "/v1/completions", body, body.get("stream") is True)


async def passthrough(request: Request, path: str) -> Response:
    """/tokenize and /detokenize, their bodies checked (workloads.serve.gateway.vllm_requests)."""
    gateway = gateway_of(request)
    if refusal := denied(gateway, request):
        return refusal
    try:
        route, body = await vllm_body(gateway, request, f"POST {path}")
        if path == "/tokenize":
            checked_tokenize(body)
        else:
            checked_detokenize(body, await vocabulary(gateway, route))
    except Refused as refused:
        return error(refused.status, str(refused), refused.code)
    except RequestError as problem:
        return error(problem.status, str(problem), problem.code)
    if (state := gateway.engine_state(route.url)) is not None:
        return engine_unavailable(route.name, state)
    try:
        reply = await gateway.client.send(gateway.client.build_request("POST", f"{route.url}{path}", json=body),
                                          stream=True)
    except httpx.HTTPError as exc:
        return error(502, f"engine for {route.name!r} is unreachable: {type(exc).__name__}", "engine_unreachable")
    return await engine_answer(reply)


async def tokenize(request: Request) -> Response:
    return await passthrough(request, "/tokenize")


async def detokenize(request: Request) -> Response:
    return await passthrough(request, "/detokenize")


def engine_urls(gateway: Gateway, engines: tuple[str, ...] = (VLLM,)) -> list[str]:
    return sorted({route.url for route in gateway.routes.values() if route.engine in engines})


async def version(request: Request) -> Response:
    gateway = gateway_of(request)
    urls = engine_urls(gateway)
    if not urls:
        return error(404, "no vLLM engine behind this endpoint", "not_found")
    try:
        answer = await gateway.client.get(f"{urls[0]}/version", timeout=10.0)
    except httpx.HTTPError as exc:
        return error(502, f"the vLLM engine is unreachable: {type(exc).__name__}", "engine_unreachable")
    return JSONResponse(answer.json(), status_code=answer.status_code)


async def metrics(request: Request) -> Response:
    gateway = gateway_of(request)
    if refusal := denied(gateway, request):
        return refusal
    urls = engine_urls(gateway, METRICS_ENGINES)
    if not urls:
        return error(404, "no vllm:* series: the engines behind this endpoint are transformers serve, which exports "
                          "none (engines vllm and peft do)", "not_found")
    try:
        texts = [(await gateway.client.get(f"{url}/metrics", timeout=10.0)).text for url in urls]
    except httpx.HTTPError as exc:
        return error(502, f"an engine is unreachable: {type(exc).__name__}", "engine_unreachable")
    return PlainTextResponse("".join(texts), media_type="text/plain; version=0.0.4; charset=utf-8")


def add_vllm_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/tokenize", tokenize, methods=["POST"])
    app.add_api_route("/detokenize", detokenize, methods=["POST"])
    app.add_api_route("/version", version, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
