"""The launch secret between the gateway and its engines: a fresh key per launch, handed to each engine in its
environment (never on its command line), sent by the gateway on every call, checked by every engine.

vLLM reads it as VLLM_API_KEY (what `--api-key` sets) and then refuses every `/v1` request without it; the CPU
engine (workloads.serve.engine.server) reads ENGINE_KEY_ENV and refuses the same way. `/health` stays open for the
supervisor's probe, as in vLLM. A process on the node that skips the gateway gets 401.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from workloads.serve.auth import bearer_matches

ENGINE_KEY_ENV = "FT_ENGINE_KEY"
VLLM_KEY_ENV = "VLLM_API_KEY"


def new_engine_key() -> str:
    return secrets.token_urlsafe(32)


def engine_env(key: str) -> dict[str, str]:
    """What every engine process gets in its environment."""
    return {ENGINE_KEY_ENV: key, VLLM_KEY_ENV: key}


def engine_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def require_engine_key(app: FastAPI, key: str) -> None:
    """Refuse every `/v1` request without `Authorization: Bearer <key>` with vLLM's 401 body."""

    @app.middleware("http")
    async def engine_key_check(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path.startswith("/v1") and not bearer_matches(request.headers.get("authorization"), key):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)
