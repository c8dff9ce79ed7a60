"""The gateway's own admin routes for adapters (API key always, also on loopback):

    POST   /admin/adapters {"name", "run_id"}   load a stored run's adapter and serve it under `name`
    DELETE /admin/adapters/{name}               stop serving it
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from documents.sections.serve import model_name_problem, shown
from workloads.serve.gateway.adapter_ops import BodyErrors, load_served, served_adapter, string_fields, unload_served
from workloads.serve.gateway.chat_routes import model_card
from workloads.serve.gateway.state import admin_denied, gateway_of
from workloads.serve.http_shared import Refused, error


ADMIN_BODY_ERRORS = BodyErrors("invalid_json", "invalid_request",
                               lambda missing: f"{', '.join(missing)}: required, a non-empty string",
                               "request body must be a JSON object")


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
        route = await load_served(gateway, name, body["run_id"], not_found="run_not_found", refused="adapter_refused")
    except Refused as refused:
        return error(refused.status, str(refused), refused.code)
    return JSONResponse(model_card(gateway, route))


async def unload_adapter(request: Request) -> JSONResponse:
    """DELETE /admin/adapters/{name}: stop serving an adapter. New requests for it get 404 at once; the ones
    the engine already holds finish (nothing in flight is cut or waited for)."""
    gateway = gateway_of(request)
    if refusal := admin_denied(gateway, request):
        return refusal
    name = request.path_params["name"]
    if (route := served_adapter(gateway, name)) is None:
        adapters = sorted(n for n, r in gateway.routes.items() if r.adapter is not None)
        return error(404, f"no adapter {shown(name)} is served; adapters: {adapters}", "model_not_found")
    try:
        await unload_served(gateway, name, route)
    except Refused as refused:
        return error(refused.status, str(refused), refused.code)
    return JSONResponse({"id": name, "unloaded": True})


def add_admin_routes(app: FastAPI) -> None:
    app.add_api_route("/admin/adapters", load_adapter, methods=["POST"])
    app.add_api_route("/admin/adapters/{name}", unload_adapter, methods=["DELETE"])
