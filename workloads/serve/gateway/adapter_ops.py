"""Loading and unloading an adapter at runtime, the one operation both admin dialects answer over (the gateway's
`/admin/adapters`, workloads.serve.gateway.admin_routes, and vLLM's `/v1/load_lora_adapter`,
workloads.serve.gateway.lora_routes): resolve the stored run, ask the engine, route the name, tell the launcher."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from fastapi import Request

from documents.text_input import TextInputError, load_json
from workloads.serve.gateway.prompt_counter import PromptCounter
from workloads.serve.gateway.relay import read_body
from workloads.serve.gateway.state import Gateway
from workloads.serve.http_shared import Refused
from workloads.serve.route import Route


@dataclass(frozen=True)
class BodyErrors:
    """How an admin API names a bad body: its error codes and its message for missing fields."""

    not_json: str
    invalid: str
    missing: Callable[[list[str]], str]
    not_object: str | None = None  # None: a body that is no object is said as every field missing


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


async def load_served(gateway: Gateway, name: str, run_id: str, not_found: str, refused: str) -> Route:
    """Serve stored run `run_id`'s adapter under `name`: resolve it (an unknown run is refused 404 with code
    `not_found`, any other reason 400 with `refused`), have the engine load it, route the name, tell the launcher."""
    assert gateway.adapter_host is not None
    try:
        entry = gateway.adapter_host.resolve(name, run_id)
        folder = gateway.adapter_host.engine_path(entry)
    except LookupError as missing:
        raise Refused(404, str(missing).strip("'\""), not_found) from None
    except ValueError as problem:
        raise Refused(400, str(problem), refused) from None
    await engine_admin(gateway, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": folder})
    route = gateway.adapter_host.route(entry)
    if route.tokenizer and route.budget:
        gateway.counters.setdefault(route.tokenizer, PromptCounter(Path(route.tokenizer)))
    gateway.routes[name] = route
    gateway.on_change()
    return route


def served_adapter(gateway: Gateway, name: str) -> Route | None:
    """The route of adapter `name` when an engine that loads adapters at runtime serves it."""
    route = gateway.routes.get(name)
    if route is None or route.adapter is None or gateway.adapter_host is None:
        return None
    return route


async def unload_served(gateway: Gateway, name: str, route: Route) -> None:
    """Stop serving adapter `name` (its `route`): new requests for it get 404 at once, the engine unloads it (the
    requests it already holds finish); if the engine refuses, the name is routed again and the Refused raised."""
    del gateway.routes[name]
    try:
        await engine_admin(gateway, "/v1/unload_lora_adapter", {"lora_name": route.upstream})
    except Refused:
        gateway.routes[name] = route
        raise
    gateway.on_change()
