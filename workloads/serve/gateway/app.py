"""The gateway app: the public routes (workloads.serve.gateway.chat_routes) over one shared `Gateway`
(workloads.serve.gateway.state), the admin routes for adapters (admin_routes), vLLM's runtime LoRA routes
(lora_routes) and its other routes (vllm_routes) beside them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from fastapi import FastAPI

from workloads.serve.engine_key import engine_headers
from workloads.serve.gateway.admin_routes import add_admin_routes
from workloads.serve.gateway.chat_routes import chat_completions, health, list_models
from workloads.serve.gateway.lora_routes import add_lora_routes
from workloads.serve.gateway.prompt_counter import PromptCounter
from workloads.serve.gateway.state import AdapterHost, Gateway, Limits
from workloads.serve.gateway.vllm_routes import add_vllm_routes
from workloads.serve.route import Route


def build_gateway(routes: list[Route], api_key: str | None, limits: Limits = Limits(), timeout_s: float = 600.0,
                  engine_state: Callable[[str], str | None] = lambda url: None,
                  adapter_host: AdapterHost | None = None, engine_key: str | None = None) -> FastAPI:
    """The gateway app: the routes above over one shared `Gateway` (app.state.gateway); every call to an engine
    carries the launch's engine key."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), headers=engine_headers(engine_key))
    gateway = Gateway(
        routes={r.name: r for r in routes}, api_key=api_key, limits=limits, client=client, engine_state=engine_state,
        counters={r.tokenizer: PromptCounter(Path(r.tokenizer)) for r in routes if r.tokenizer and r.budget},
        adapter_host=adapter_host,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(title="soperator-finetune gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    add_admin_routes(app)
    add_lora_routes(app)
    add_vllm_routes(app)
    return app
