"""vLLM's runtime LoRA routes at the gateway, with vLLM's bodies and status codes, so that a client written for
vLLM's OpenAI server works unchanged:

    POST /v1/load_lora_adapter   {"lora_name": NAME, "lora_path": RUN_ID or the stored adapter folder}
    POST /v1/unload_lora_adapter {"lora_name": NAME}

200 with vLLM's plain-text "Success: ..." line; errors as vLLM's ErrorResponse
(`{"error": {"message", "type", "param", "code"}}`): 400 for a missing field, a name already loaded or an adapter
refused (another base, changed files, a folder outside the run store), 404 for an unknown run or adapter.
`lora_path` names a stored run, never a raw folder: a path is accepted only as a stored run's adapter folder in
the run store. Both need the gateway's API key (as the /admin routes do).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from documents.run_store import ADAPTER_DIR, run_key
from documents.sections.serve import MODEL_NAME, shown
from workloads.serve.gateway.adapter_ops import BodyErrors, load_served, served_adapter, string_fields, unload_served
from workloads.serve.gateway.state import Gateway, admin_denied, gateway_of
from workloads.serve.http_shared import Refused

LOAD_FIELDS = ("lora_name", "lora_path")
UNLOAD_FIELDS = ("lora_name",)
VLLM_KINDS = ("InvalidUserInput", "BadRequestError", "NotFoundError", "InternalServerError")


def vllm_error(refused: Refused) -> JSONResponse:
    """vLLM's ErrorResponse body (vllm/entrypoints/serve/utils/error_response.py); a Refused whose code is not
    one of vLLM's types gets BadRequestError (4xx) or InternalServerError."""
    kind = refused.code if refused.code in VLLM_KINDS else (
        "BadRequestError" if refused.status < 500 else "InternalServerError")
    return JSONResponse({"error": {"message": str(refused), "type": kind, "param": None, "code": refused.status}},
                        status_code=refused.status)


def vllm_body_errors(fields: tuple[str, ...]) -> BodyErrors:
    """vLLM's terms for a bad body: one kind, and every required field named when one is missing."""
    need = " and ".join(f"'{f}'" for f in fields)
    return BodyErrors("InvalidUserInput", "InvalidUserInput", lambda _missing: f"{need} must be provided.")


def run_id_of(gateway: Gateway, lora_path: str) -> str:
    """A run id as given, or the run whose stored adapter folder `lora_path` is; any other path is refused."""
    assert gateway.adapter_host is not None
    if "/" not in lora_path:
        return lora_path
    run_id = gateway.adapter_host.run_of_path(lora_path)
    if run_id is None:
        raise Refused(400, f"lora_path {shown(lora_path)} is not a stored run's adapter folder in the run store "
                           f"(give a run id, or {run_key('<stack>', '<run_id>')}/{ADAPTER_DIR} in the store): refused",
                      "BadRequestError")
    return run_id


async def load_lora_adapter(request: Request) -> Response:
    gateway = gateway_of(request)
    if refusal := admin_denied(gateway, request):
        return refusal
    try:
        if gateway.adapter_host is None:
            raise Refused(400, "this engine does not load adapters at runtime", "BadRequestError")
        body = await string_fields(request, LOAD_FIELDS, vllm_body_errors(LOAD_FIELDS))
        name = body["lora_name"]
        if not MODEL_NAME.match(name):
            raise Refused(400, f"lora_name must match {MODEL_NAME.pattern}, got {shown(name)}", "InvalidUserInput")
        if name in gateway.routes:
            raise Refused(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
        try:
            run_id = run_id_of(gateway, body["lora_path"])
        except ValueError as problem:
            raise Refused(400, str(problem), "BadRequestError") from None
        await load_served(gateway, name, run_id, not_found="NotFoundError", refused="BadRequestError")
    except Refused as refused:
        return vllm_error(refused)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: Request) -> Response:
    gateway = gateway_of(request)
    if refusal := admin_denied(gateway, request):
        return refusal
    try:
        name = (await string_fields(request, UNLOAD_FIELDS, vllm_body_errors(UNLOAD_FIELDS)))["lora_name"]
    except Refused as refused:
        return vllm_error(refused)
    if (route := served_adapter(gateway, name)) is None:
        return vllm_error(Refused(404, f"The lora adapter {shown(name)} cannot be found.", "NotFoundError"))
    try:
        await unload_served(gateway, name, route)
    except Refused as refused:
        return vllm_error(Refused(500, str(refused), "InternalServerError"))
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def add_lora_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"])
    app.add_api_route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"])
