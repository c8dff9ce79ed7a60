"""What the gateway's routes share: the served models by name, the limits, the key, one HTTP client to the engines,
the engine that loads adapters at runtime and each name's measured speed; the API-key checks every route makes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse

from documents.adapter_registry import AdapterEntry, AdapterSpeed
from documents.sections.serve import ServeConfig
from workloads.serve.auth import bearer_matches
from workloads.serve.gateway.prompt_counter import PromptCounter
from workloads.serve.http_shared import Refused, error
from workloads.serve.route import Route


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (ServeConfig.max_tokens_limit, max_body_bytes)."""

    max_tokens: int = ServeConfig.model_fields["max_tokens_limit"].default
    max_body_bytes: int = 1 << 20

    def granted(self, asked: int | None) -> int:
        """The max_tokens a request gets: what it asked (a validated whole number >= 1) or the limit when it asked
        none; Refused 400 over the limit."""
        if asked is not None and asked > self.max_tokens:
            raise Refused(400, f"max_tokens {asked} is over this endpoint's limit of {self.max_tokens}",
                          "max_tokens_too_large")
        return asked or self.max_tokens


@dataclass(frozen=True)
class AdapterHost:
    """The engine that loads adapters at runtime, and how a stored run becomes an entry and a route.
    `resolve(name, run_id)` raises ValueError (LookupError for an unknown run) with the reason to refuse."""

    url: str
    resolve: Callable[[str, str], AdapterEntry]
    route: Callable[[AdapterEntry], Route]
    run_of_path: Callable[[str], str | None] = lambda path: None
    """the stored run whose adapter folder in the store is `path` (vLLM's lora_path), else None"""
    engine_path: Callable[[AdapterEntry], str] = lambda entry: entry.adapter_dir
    """the folder the engine is told to load: the store's (the CPU engine reads it itself, following no link), or
    a private copy of the files read from it (vLLM; workloads.serve.adapter_files.engine_copy), ValueError when
    they cannot be read or changed"""


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


def admin_denied(gateway: Gateway, request: Request) -> JSONResponse | None:
    """Admin routes need the API key, also on loopback: without one configured they are closed."""
    if not gateway.api_key:
        return error(403, "admin routes need an API key: start the server with one (serve.api_key_env)", "admin_closed")
    return denied(gateway, request)
