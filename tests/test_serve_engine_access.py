"""The engine behind the gateway answers only the gateway; adapters come only from the run store, with their hash;
vLLM's LoRA routes and cards at the gateway (the OpenAI SDK and plain HTTP); the served set survives an engine
killed under load and a launcher started again. The real peft engine and gateway on loopback, stored runs of
the tiny model (adapter_fixtures)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from adapter_fixtures import ADAPTERS, SPARE, AdapterRuns, adapter_flags
from adapter_runs import STACK
from eval_fixtures import children, start_server, stop_server

from documents.run_config import RunConfig
from documents.run_record import read_run_record
from serve_process import ENGINE_PORTS, free_port

pytestmark = pytest.mark.slow

NAMES = list(ADAPTERS)
STARTED = NAMES[0]
TAMPERED = NAMES[2]
KEY = "gateway-key"


@dataclass
class Server:
    proc: object
    url: str
    engine_url: str
    store: Path
    run: RunConfig
    log: Path
    headers = {"Authorization": f"Bearer {KEY}"}

    def engine_pid(self) -> int:
        (pid,) = children(self.proc.pid)
        return pid

    def engine_key(self) -> str:
        """What only the engine's own user can read: its environment."""
        environ = Path(f"/proc/{self.engine_pid()}/environ").read_bytes().split(b"\0")
        return next(item.split(b"=", 1)[1].decode() for item in environ if item.startswith(b"FT_ENGINE_KEY="))

    def models(self) -> dict[str, dict]:
        reply = httpx.get(f"{self.url}/v1/models", headers=self.headers, timeout=10)
        return {card["id"]: card for card in reply.json()["data"]}

    def chat(self, model: str, max_tokens: int = 4) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/chat/completions", headers=self.headers, timeout=300, json={
            "model": model, "messages": [{"role": "user", "content": "What is a bond?"}], "max_tokens": max_tokens,
            "temperature": 0.0})


def start(run: RunConfig, store: Path, work: Path, extra: list[str]) -> Server:
    engine_port = free_port(ENGINE_PORTS)
    work.mkdir(parents=True, exist_ok=True)
    proc, url, log = start_server(run, work, KEY, [*extra, "--runs-store", str(store), "--backend-port",
                                                    str(engine_port)], timeout_s=300)
    return Server(proc, url, f"http://127.0.0.1:{engine_port}", store, run, log)


@pytest.fixture(scope="module")
def server(adapter_runs: AdapterRuns, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A copy of the run store with one stored adapter's weights changed after it was stored; a run config of
    its own (its served set is persisted beside its results)."""
    root = tmp_path_factory.mktemp("engine-access")
    store = root / "store"
    shutil.copytree(adapter_runs.store_dir, store)
    (weights,) = store.glob(f"runs/{STACK}/run-{TAMPERED}/adapter/adapter_model.safetensors")
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    run = adapter_runs.run.model_copy(update={"paths": adapter_runs.run.paths.model_copy(update={"root": str(root)})})
    launched = start(run, store, root / "first", adapter_flags([STARTED]))
    yield launched
    stop_server(launched.proc)


def test_the_engine_refuses_a_request_without_the_launch_key(server: Server) -> None:
    body = {"model": STARTED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for headers in ({}, server.headers, {"Authorization": "Bearer wrong"}):
        assert httpx.post(f"{server.engine_url}/v1/chat/completions", json=body, headers=headers, timeout=30).status_code == 401
        load = httpx.post(f"{server.engine_url}/v1/load_lora_adapter", headers=headers, timeout=30,
                          json={"lora_name": "x", "lora_path": str(server.store)})
        assert load.status_code == 401
    assert httpx.get(f"{server.engine_url}/health", timeout=10).status_code == 200
    key = {"Authorization": f"Bearer {server.engine_key()}"}
    assert httpx.post(f"{server.engine_url}/v1/chat/completions", json=body, headers=key, timeout=120).status_code == 200
    assert server.chat(STARTED).status_code == 200


def test_loads_come_only_from_the_store_with_their_hash(server: Server, adapter_runs: AdapterRuns) -> None:
    route = f"{server.url}/v1/load_lora_adapter"
    outside = adapter_runs.store_dir.parent / "adapters" / SPARE  # the trained folder itself, not the store's copy
    reply = httpx.post(route, headers=server.headers, timeout=60, json={"lora_name": "desk-x", "lora_path": str(outside)})
    assert reply.status_code == 400 and "not a stored run's adapter folder" in reply.json()["error"]["message"]
    escape = server.store / "runs" / ".." / ".." / "adapters" / SPARE
    reply = httpx.post(route, headers=server.headers, timeout=60, json={"lora_name": "desk-x", "lora_path": str(escape)})
    assert reply.status_code == 400
    reply = httpx.post(route, headers=server.headers, timeout=60,
                       json={"lora_name": "desk-t", "lora_path": f"run-{TAMPERED}"})
    assert reply.status_code == 400, reply.text
    assert "changed since stored" in reply.json()["error"]["message"]
    assert reply.json()["error"] == {**reply.json()["error"], "type": "BadRequestError", "code": 400}
    assert set(server.models()) == {"base", STARTED}


def test_the_engine_itself_loads_only_stored_adapters_with_their_hash(server: Server, adapter_runs: AdapterRuns) -> None:
    """Issue 54, item 5: a process holding the engine key, skipping the gateway, gets the store's rules from the
    engine too; the engine holds the launch's key, not the public API key."""
    key = {"Authorization": f"Bearer {server.engine_key()}"}
    route = f"{server.engine_url}/v1/load_lora_adapter"
    outside = adapter_runs.store_dir.parent / "adapters" / SPARE
    reply = httpx.post(route, headers=key, timeout=60, json={"lora_name": "sneak", "lora_path": str(outside)})
    assert reply.status_code == 400 and "not a stored run's adapter folder" in reply.json()["error"]["message"]
    (tampered,) = server.store.glob(f"runs/{STACK}/run-{TAMPERED}/adapter")
    reply = httpx.post(route, headers=key, timeout=60, json={"lora_name": "sneak", "lora_path": str(tampered)})
    assert reply.status_code == 400 and "changed since stored" in reply.json()["error"]["message"]
    assert "sneak" not in engine_models(server)
    environ = Path(f"/proc/{server.engine_pid()}/environ").read_bytes().split(b"\0")
    assert not any(item.startswith(b"FT_API_KEY=") for item in environ)


def test_an_adapter_file_linked_out_of_the_store_is_refused_by_gateway_and_engine(server: Server, tmp_path: Path) -> None:
    """Issue 64, item 1, the probe on the peft engine: `ln -sf /outside/adapter_model.safetensors
    runs/local/R/adapter/` with the same bytes (so the recorded hash matches), then `POST /v1/load_lora_adapter
    {"lora_name": "linked", "lora_path": "R"}` at the gateway answered 200, and so did the engine asked directly
    with the engine key. Both refuse it now, naming the link."""
    linked = NAMES[1]
    (weights,) = server.store.glob(f"runs/{STACK}/run-{linked}/adapter/adapter_model.safetensors")
    kept = weights.read_bytes()
    outside = tmp_path / "adapter_model.safetensors"
    outside.write_bytes(kept)
    weights.unlink()
    weights.symlink_to(outside)
    try:
        reply = httpx.post(f"{server.url}/v1/load_lora_adapter", headers=server.headers, timeout=60,
                           json={"lora_name": "linked", "lora_path": f"run-{linked}"})
        assert reply.status_code == 400, reply.text
        assert f"run-{linked}/adapter/adapter_model.safetensors is a symbolic link" in reply.json()["error"]["message"]
        key = {"Authorization": f"Bearer {server.engine_key()}"}
        reply = httpx.post(f"{server.engine_url}/v1/load_lora_adapter", headers=key, timeout=60,
                           json={"lora_name": "linked", "lora_path": str(weights.parent)})
        assert reply.status_code == 400 and "is a symbolic link" in reply.json()["error"]["message"], reply.text
        assert "linked" not in engine_models(server) and "linked" not in server.models()
    finally:
        weights.unlink()
        weights.write_bytes(kept)


def test_vllm_routes_with_the_openai_sdk_and_plain_http(server: Server) -> None:
    """A client written for vLLM: load by run id (SDK) and by the store's adapter folder (plain HTTP), list with
    parent and root, call, unload; vLLM's status codes for a name loaded twice and an unknown one."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    loaded = client.post("/load_lora_adapter", cast_to=httpx.Response,
                         body={"lora_name": SPARE, "lora_path": f"run-{SPARE}"})
    assert loaded.status_code == 200 and loaded.text == f"Success: LoRA adapter '{SPARE}' added successfully."
    cards = {model.id: model for model in client.models.list()}
    assert cards[SPARE].parent == "base" and cards["base"].parent is None
    (stored,) = server.store.glob(f"runs/{STACK}/run-{SPARE}/adapter")
    assert cards[SPARE].root == f"runs/{STACK}/run-{SPARE}/adapter" and cards[SPARE].run_id == f"run-{SPARE}"
    assert cards[SPARE].adapter_sha256 == read_run_record((stored.parent / "run.json").read_text(), "run.json").adapter_sha256
    answer = client.chat.completions.create(model=SPARE, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                            temperature=0.0)
    assert answer.model == SPARE and answer.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as twice:
        client.post("/load_lora_adapter", cast_to=httpx.Response, body={"lora_name": SPARE, "lora_path": f"run-{SPARE}"})
    assert "already been loaded" in twice.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.post("/load_lora_adapter", cast_to=httpx.Response, body={"lora_name": "desk-y", "lora_path": "run-none"})
    gone = client.post("/unload_lora_adapter", cast_to=httpx.Response, body={"lora_name": SPARE})
    assert gone.text == f"Success: LoRA adapter '{SPARE}' removed successfully."
    with pytest.raises(openai.NotFoundError):
        client.post("/unload_lora_adapter", cast_to=httpx.Response, body={"lora_name": SPARE})

    plain = httpx.post(f"{server.url}/v1/load_lora_adapter", headers=server.headers, timeout=120,
                       json={"lora_name": "desk-path", "lora_path": str(stored)})
    assert plain.status_code == 200, plain.text
    assert server.models()["desk-path"]["parent"] == "base"
    assert server.chat("desk-path").json()["model"] == "desk-path"
    assert httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "b"},
                      timeout=10).status_code == 401
    missing = httpx.post(f"{server.url}/v1/load_lora_adapter", headers=server.headers, json={"lora_name": "a"}, timeout=10)
    assert missing.status_code == 400 and missing.json()["error"]["type"] == "InvalidUserInput"
    assert httpx.post(f"{server.url}/v1/unload_lora_adapter", headers=server.headers, timeout=120,
                      json={"lora_name": "desk-path"}).status_code == 200


def engine_models(server: Server) -> set[str]:
    reply = httpx.get(f"{server.engine_url}/v1/models", headers={"Authorization": f"Bearer {server.engine_key()}"},
                      timeout=10)
    return {card["id"] for card in reply.json()["data"]}


def test_unloading_every_adapter_leaves_the_base(server: Server) -> None:
    route = f"{server.url}/v1/unload_lora_adapter"
    assert httpx.post(route, headers=server.headers, json={"lora_name": STARTED}, timeout=120).status_code == 200
    assert set(server.models()) == {"base"} and engine_models(server) == {"base"}
    assert server.chat("base").status_code == 200
    assert httpx.post(f"{server.url}/v1/load_lora_adapter", headers=server.headers, timeout=120,
                      json={"lora_name": STARTED, "lora_path": f"run-{STARTED}"}).status_code == 200


def keep_asking(server: Server, model: str, stop: threading.Event, statuses: list) -> None:
    while not stop.is_set():
        try:
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", headers=server.headers, timeout=300, json={
                    "model": model, "messages": [{"role": "user", "content": "Tell me about bonds."}],
                    "max_tokens": 24, "temperature": 0.0, "stream": True}) as reply:
                for _ in reply.iter_lines():
                    pass
                statuses.append((model, reply.status_code))
        except httpx.HTTPError as exc:
            statuses.append((model, type(exc).__name__))
        time.sleep(0.05)


def test_an_engine_killed_under_load_comes_back_with_the_served_set(server: Server) -> None:
    """A runtime-loaded adapter answers after the engine is killed and restarted; startup adapters unloaded since
    stay unloaded; no listed name ever gets a 404 (503 with Retry-After while the engine is away)."""
    load = httpx.post(f"{server.url}/v1/load_lora_adapter", headers=server.headers, timeout=120,
                      json={"lora_name": SPARE, "lora_path": f"run-{SPARE}"})
    assert load.status_code == 200, load.text
    listed = set(server.models())
    assert listed == {"base", STARTED, SPARE}
    stop, statuses = threading.Event(), []
    models = ["base", STARTED, SPARE] * 3
    threads = [threading.Thread(target=keep_asking, args=(server, m, stop, statuses)) for m in models[:8]]
    for thread in threads:
        thread.start()
    time.sleep(3)
    old = server.engine_pid()
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        pids = children(server.proc.pid)
        if pids and pids != [old] and httpx.get(f"{server.url}/health", timeout=10).status_code == 200:
            break
        time.sleep(1)
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200, server.log.read_text()[-2000:]
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join(timeout=300)
    codes = {code for _, code in statuses}
    assert 404 not in codes, statuses
    assert 503 in codes, statuses
    assert server.chat(SPARE).status_code == 200
    assert set(server.models()) == engine_models(server) == listed
    served = json.loads((server.run.results_dir / "served_adapters.json").read_text())
    assert {a["name"] for a in served["adapters"]} == {STARTED, SPARE}


def test_a_launcher_started_again_serves_the_persisted_set(server: Server, tmp_path: Path) -> None:
    """--resume (a requeued job's default) serves what the last launcher served, not its command line's set."""
    stop_server(server.proc)
    again = start(server.run, server.store, tmp_path / "again", [*adapter_flags([NAMES[1]]), "--resume"])
    try:
        assert set(again.models()) == {"base", STARTED, SPARE}
        assert again.chat(SPARE).status_code == 200
    finally:
        stop_server(again.proc)
