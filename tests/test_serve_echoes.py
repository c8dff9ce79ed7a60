"""What the gateway echoes (issue 54, item 8): vLLM-style routes quote at most the first 80 characters of a name
they refuse, and /v1/models cards name folders without the server's absolute paths. The gateway app in process;
no engine is reached (every answer here is the gateway's own)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from documents.adapter_registry import AdapterEntry
from documents.sections.serve import ServeConfig
from workloads.serve.gateway.app import build_gateway
from workloads.serve.gateway.state import AdapterHost
from workloads.serve.launcher.engine_plan import adapter_route, base_route

KEY = "echo-key"
LONG = "x" * 10_000


def unknown(name: str, run_id: str) -> AdapterEntry:
    raise LookupError(f"no run {run_id[:80]!r}")


def gateway(tmp_path: Path) -> TestClient:
    store = tmp_path / "store"
    folder = store / "runs" / "local" / "run-a" / "adapter"
    folder.mkdir(parents=True)
    cfg = ServeConfig(runs_store=str(store), engine="vllm")
    entry = AdapterEntry(name="desk-a", run_id="run-a", adapter_dir=str(folder), base_model_sha256="b")
    base = tmp_path / "models" / "base"
    base.mkdir(parents=True)
    url = "http://127.0.0.1:9"
    routes = [adapter_route(entry, url, base, cfg, "vllm"), base_route(base, url, cfg, "vllm")]
    host = AdapterHost(url, unknown, lambda e: adapter_route(e, url, base, cfg, "vllm"))
    return TestClient(build_gateway(routes, KEY, adapter_host=host))


def test_refusals_quote_a_long_name_cut(tmp_path: Path) -> None:
    with gateway(tmp_path) as client:
        headers = {"Authorization": f"Bearer {KEY}"}
        for route, body, status in (("/v1/unload_lora_adapter", {"lora_name": LONG}, 404),
                                    ("/v1/load_lora_adapter", {"lora_name": LONG, "lora_path": "run-a"}, 400),
                                    ("/v1/load_lora_adapter", {"lora_name": "ok", "lora_path": "/" + LONG}, 400)):
            reply = client.post(route, json=body, headers=headers)
            message = reply.json()["error"]["message"]
            assert reply.status_code == status, message
            assert f"... ({len(body['lora_name'] if body['lora_name'] == LONG else body['lora_path'])} characters)" in message
            assert len(message) < 600, (route, len(message))


def test_cards_name_no_absolute_server_path(tmp_path: Path) -> None:
    with gateway(tmp_path) as client:
        cards = {card["id"]: card for card in client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]}
    assert cards["desk-a"]["root"] == "runs/local/run-a/adapter" and cards["base"]["root"] == "base"
    assert not any(str(tmp_path) in str(value) for card in cards.values() for value in card.values())


def test_the_chat_and_admin_delete_404s_quote_a_long_name_cut(tmp_path: Path) -> None:
    """Issue 64, item 5, the probes: `POST /v1/chat/completions {"model": "x" * 10_000, ...}` and
    `DELETE /admin/adapters/xxx...` (10,000 characters) answered 404 quoting the whole name; completions quote it
    cut as well."""
    headers = {"Authorization": f"Bearer {KEY}"}
    with gateway(tmp_path) as client:
        replies = [client.post("/v1/chat/completions", headers=headers,
                               json={"model": LONG, "messages": [{"role": "user", "content": "hi"}]}),
                   client.delete(f"/admin/adapters/{LONG}", headers=headers),
                   client.post("/v1/completions", headers=headers, json={"model": LONG, "prompt": "hi"})]
    for reply in replies:
        message = reply.json()["error"]["message"]
        assert reply.status_code == 404, message
        assert "'" + "x" * 80 + "'... (10000 characters)" in message and len(message) < 600, len(message)
