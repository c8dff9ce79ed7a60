"""The public face of the endpoint: API-key check, model names (base, finetuned) and routing to engine processes.

Engines (`transformers serve`, vLLM) listen on loopback ports; the gateway streams their responses through,
replacing the engine's internal model id (a folder path) with the public name.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from workloads.serve.auth import bearer_matches

OPEN_PATHS = {"/health"}


@dataclass(frozen=True)
class Route:
    name: str
    url: str
    upstream: str
    kind: str


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


def build_gateway(routes: list[Route], api_key: str | None, timeout_s: float = 600.0) -> FastAPI:
    by_name = {r.name: r for r in routes}
    created = int(time.time())
    client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(title="soperator-finetune gateway", lifespan=lifespan)

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if api_key and request.url.path not in OPEN_PATHS and not bearer_matches(request.headers.get("authorization"), api_key):
            return error(401, "missing or wrong API key (send Authorization: Bearer <key>)", "invalid_api_key")
        return await call_next(request)

    @app.get("/health")
    async def health() -> JSONResponse:
        states: dict[str, str] = {}
        for url in sorted({r.url for r in routes}):
            try:
                ok = (await client.get(f"{url}/health", timeout=5.0)).status_code == 200
            except httpx.HTTPError:
                ok = False
            for r in routes:
                if r.url == url:
                    states[r.name] = "ok" if ok else "down"
        healthy = all(s == "ok" for s in states.values())
        return JSONResponse({"status": "ok" if healthy else "unhealthy", "models": states}, status_code=200 if healthy else 503)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        data = [{"id": r.name, "object": "model", "created": created, "owned_by": "soperator-finetune", "kind": r.kind} for r in routes]
        return JSONResponse({"object": "list", "data": data})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "request body is not JSON", "invalid_json")
        if not isinstance(body, dict):
            return error(400, "request body must be a JSON object", "invalid_json")
        route = by_name.get(body.get("model"))
        if route is None:
            return error(404, f"model {body.get('model')!r} is not served; choose one of {sorted(by_name)}", "model_not_found")
        body["model"] = route.upstream
        upstream = client.build_request("POST", f"{route.url}/v1/chat/completions", json=body)
        try:
            reply = await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            return error(502, f"engine for {route.name!r} is unreachable: {type(exc).__name__}", "engine_unreachable")
        if not body.get("stream") or reply.status_code != 200:
            content = await reply.aread()
            await reply.aclose()
            try:
                document = json.loads(content)
                if isinstance(document, dict) and "model" in document:
                    document["model"] = route.name
                return JSONResponse(document, status_code=reply.status_code)
            except ValueError:
                return Response(content, status_code=reply.status_code, media_type=reply.headers.get("content-type"))

        async def relay() -> AsyncIterator[str]:
            try:
                async for line in reply.aiter_lines():
                    yield rename_sse_line(line, route.name) + "\n"
            finally:
                await reply.aclose()

        return StreamingResponse(relay(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    return app
