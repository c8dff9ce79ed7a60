"""One base model in memory, many LoRA adapters on it, one OpenAI-compatible process (the CPU engine).

    FT_ENGINE_KEY=... python -m workloads.serve.engine.server --base DIR --base-name base --port 8100 \
        --lora-modules '{"name": "desk-a", "path": "DIR"}' ...

Unlike `transformers serve` (one model per process, so one merged copy per fine-tune), this engine loads the
base once, adds each adapter with peft's `load_adapter`, and decodes every running request in one batch, each
row with its own adapter (the adapters stacked per layer, workloads.serve.engine.stacked_lora; `__base__` for the base)
and its own sampling settings. It speaks the subset of vLLM's API the gateway uses: streamed chat completions,
/health, /v1/models, the dynamic LoRA routes `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`, and /metrics
(vLLM's `vllm:*` series that hold here, workloads.serve.engine.metrics). It listens on loopback only and, like vLLM
with `--api-key`, answers `/v1` only with the launch's engine key (workloads.serve.engine_key); /health and
/metrics stay open as vLLM's do (its key guards /v1 only). The gateway is the public face (API key, limits, admin
routes).

Batching is continuous (workloads.serve.engine.batching): requests join the running batch and leave it between two
decode steps. Adapter loads and unloads run between two steps as well; an unload waits only while a running or
waiting request still uses that adapter, so it never cuts a generation short.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from documents.run_manifest import model_hash
from documents.sections.serve import shown
from workloads.common.chat_template import prompt_ids
from workloads.serve.adapter_files import AdapterFiles, read_adapter, write_copy
from workloads.serve.engine.batching import RunningBatch
from workloads.serve.engine.metrics import VLLM_DEFAULT_MAX_LEN, EngineMetrics, RequestTimes
from workloads.serve.engine.stacked_lora import StackedLora, unstackable
from workloads.serve.engine_key import ENGINE_KEY_ENV, require_engine_key
from workloads.serve.http_shared import error
from workloads.serve.registry import RegistryError, run_of_path, stored_adapter_files, stored_runs
from workloads.serve.request import RequestError, parse_chat_request
from workloads.serve.token_budget import model_context

BASE_ROW = "__base__"
"""peft's adapter name for a row that runs the bare base."""
IDLE_POLL_S = 0.05


@dataclass
class Generation:
    """One request in the engine: its prompt, its adapter and sampling, and where its tokens go."""

    prompt_ids: list[int]
    adapter: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    events: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    ignore_eos: bool = False
    cancelled: threading.Event = field(default_factory=threading.Event)
    times: RequestTimes = field(default_factory=RequestTimes.now)
    """queued (now), started, first and last token: the metrics' timings"""

    def emit(self, event: tuple) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass
class Command:
    """An adapter load or unload, run by the worker between two decode steps."""

    action: str
    name: str
    files: AdapterFiles | None
    """what a load loads: the bytes read (and hashed) through descriptors that follow no link"""
    done: asyncio.Future
    loop: asyncio.AbstractEventLoop

    def answer(self, error: str | None) -> None:
        self.loop.call_soon_threadsafe(lambda: self.done.done() or self.done.set_result(error))


class AdapterModel:
    """The base with its adapters (peft) and one batched forward. Only the worker thread calls in."""

    def __init__(self, base: Path, adapters: dict[str, Path], dtype: str, device: str, max_loras: int) -> None:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch, self.peft_model = torch, PeftModel
        self.tokenizer = AutoTokenizer.from_pretrained(base)
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype).to(device).eval()
        self.adapters: set[str] = set()
        self.stacked = StackedLora()
        self.device, self.max_loras = device, max(max_loras, len(adapters))
        for name, path in adapters.items():
            self.load(name, read_adapter(path))
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            self.eos.add(self.tokenizer.eos_token_id)
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos, default=0)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return list(prompt_ids(self.tokenizer, messages))

    def load(self, name: str, files: AdapterFiles) -> None:
        """Adds the adapter whose files were read as `files`: peft reads a private copy of those bytes (removed
        once loaded), never the folder they came from again."""
        if name in self.adapters or name == BASE_ROW:
            raise ValueError(f"adapter {name!r} is already loaded")
        if len(self.adapters) >= self.max_loras:
            raise ValueError(f"{len(self.adapters)} adapters are loaded, the most this engine holds (--max-loras)")
        with tempfile.TemporaryDirectory(prefix="ft-engine-adapter-") as private:
            path = str(write_copy(files, Path(private) / "adapter"))
            if isinstance(self.model, self.peft_model):
                self.model.load_adapter(path, adapter_name=name)
            else:
                self.model = self.peft_model.from_pretrained(self.model, path, adapter_name=name).eval()
        problem = unstackable(self.model, name)
        if problem:
            self.remove(name)
            self.restack()
            raise ValueError(f"{files.folder}: {problem}; this engine serves plain LoRA on linear layers only")
        self.adapters.add(name)
        self.restack()

    def unload(self, name: str) -> None:
        if name not in self.adapters:
            raise ValueError(f"adapter {name!r} is not loaded")
        self.remove(name)
        self.adapters.discard(name)
        self.restack()

    def remove(self, name: str) -> None:
        """The last adapter's removal gives back the bare base (peft's `unload`: the LoRA layers removed, nothing
        merged); the next load wraps it again."""
        if set(self.model.peft_config) == {name}:
            self.model = self.model.unload()
            return
        if self.model.active_adapter == name:
            self.model.set_adapter(next(a for a in sorted(self.model.peft_config) if a != name))
        self.model.delete_adapter(name)

    def restack(self) -> None:
        """After a load or unload: the adapters stacked for one pass per batch (workloads.serve.engine.stacked_lora)."""
        if self.adapters:
            self.stacked.rebuild(self.model, sorted(self.adapters))
        else:
            self.stacked.close()

    def forward(self, ids: Any, mask: Any, positions: Any, cache: Any, names: list[str]) -> tuple[Any, Any]:
        """One forward of the batch, each row through its adapter; the last position's logits and the cache."""
        if self.adapters:
            self.stacked.route(names)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :], out.past_key_values


class Worker:
    """The thread that owns the model: between two decode steps of the running batch it runs adapter commands and
    lets waiting requests join (up to `max_batch` rows); finished rows leave at once."""

    def __init__(self, engine: AdapterModel, max_batch: int, metrics: EngineMetrics) -> None:
        self.engine, self.max_batch, self.metrics = engine, max_batch, metrics
        self.inbox: queue.Queue[Generation] = queue.Queue()
        self.commands: queue.Queue[Command] = queue.Queue()
        self.waiting_unloads: list[Command] = []
        self.thread = threading.Thread(target=self.run, name="adapter-engine", daemon=True)
        self.failure: str | None = None
        self.batch = RunningBatch(engine.forward, engine.tokenizer, engine.eos, engine.pad, engine.device, metrics)
        self.joining = 0
        """requests taken from the inbox and being prefilled (running, as vLLM counts them)"""
        metrics.watch(running=lambda: len(self.batch.rows) + self.joining, waiting=self.inbox.qsize)

    def run(self) -> None:
        try:
            with self.engine.torch.inference_mode():
                self.serve()
        except Exception as exc:  # the engine is broken: /health says so and the supervisor restarts it
            self.failure = f"{type(exc).__name__}: {exc}"
            raise

    def serve(self) -> None:
        batch = self.batch
        while True:
            self.run_commands(batch.adapters)
            joining = self.take(self.max_batch - len(batch.rows), wait=not batch.rows)
            self.joining = len(joining)
            try:
                if joining:
                    batch.join(joining)
                self.joining = 0
                if batch.rows:
                    batch.step()
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                batch.fail(message)
                for row in joining:
                    if not any(running.request is row for running in batch.rows):
                        self.metrics.unscheduled("error")
                    row.emit(("error", message))
                raise
            if joining or batch.rows:
                self.report_adapters(batch.adapters)

    def report_adapters(self, running: set[str]) -> None:
        """vLLM's lora_requests_info after a step: the adapters running and waiting (the base's rows are none)."""
        waiting = {row.adapter for row in list(self.inbox.queue) if not row.cancelled.is_set()}
        self.metrics.adapters(running - {BASE_ROW}, waiting - {BASE_ROW})

    def take(self, room: int, wait: bool) -> list[Generation]:
        """Up to `room` waiting requests (waiting a moment for the first when the batch is empty); a request for
        an adapter not loaded gets its error here."""
        taken: list[Generation] = []
        while len(taken) < room:
            try:
                row = self.inbox.get(timeout=IDLE_POLL_S) if wait and not taken else self.inbox.get_nowait()
            except queue.Empty:
                break
            if row.cancelled.is_set():
                self.metrics.unscheduled("abort")
                continue
            if row.adapter != BASE_ROW and row.adapter not in self.engine.adapters:
                row.emit(("error", f"adapter {row.adapter!r} is not loaded"))
                continue
            taken.append(row)
        return taken

    def run_commands(self, running: set[str]) -> None:
        """Loads at once; an unload once no running or waiting request uses its adapter."""
        while True:
            try:
                self.waiting_unloads.append(self.commands.get_nowait())
            except queue.Empty:
                break
        if not self.waiting_unloads:
            return
        busy = running | {row.adapter for row in list(self.inbox.queue) if not row.cancelled.is_set()}
        later = []
        for command in self.waiting_unloads:
            if command.action == "unload" and command.name in busy:
                later.append(command)
            else:
                self.command(command)
        self.waiting_unloads = later

    def command(self, command: Command) -> None:
        try:
            if command.action == "load":
                assert command.files is not None
                self.engine.load(command.name, command.files)
            else:
                self.engine.unload(command.name)
        except ValueError as problem:
            command.answer(str(problem))
            return
        command.answer(None)


def sse(document: dict[str, Any]) -> str:
    return f"data: {json.dumps(document, ensure_ascii=False)}\n\n"


async def completion_events(generation: Generation, public: str, include_usage: bool) -> AsyncIterator[str]:
    """The SSE chunks of one generation; the client hanging up cancels the row."""
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": public,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    try:
        yield sse(chunk({"role": "assistant", "content": ""}, None))
        while True:
            event = await generation.events.get()
            if event[0] == "delta":
                yield sse(chunk({"content": event[1]}, None))
            elif event[0] == "error":
                yield sse({"error": {"message": event[1], "type": "engine_error"}})
                break
            else:
                _, finish, prompt_tokens, completion_tokens = event
                yield sse(chunk({}, finish))
                if include_usage:
                    yield sse({"id": ident, "object": "chat.completion.chunk", "created": created, "model": public,
                               "choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                        "completion_tokens": completion_tokens,
                                                        "total_tokens": prompt_tokens + completion_tokens}})
                break
        yield "data: [DONE]\n\n"
    finally:
        generation.cancelled.set()


StoreCheck = Callable[[str], AdapterFiles]
"""the files of a folder asked for at runtime, read as they will be loaded; ValueError when it cannot be loaded
(not a stored run's adapter, a link in the run, changed files)"""


def store_check(store: Path, stack_name: str, base: Path) -> StoreCheck:
    """The run store's rules, checked by the engine itself (not only by the gateway): a runtime load is a stored
    run's adapter folder of `stack_name`, trained on `base`, with no link in the run, whose files hash to what the
    store recorded; the bytes hashed are the bytes loaded."""
    digest = model_hash(base)

    def check(path: str) -> AdapterFiles:
        runs = stored_runs(store, stack_name)
        run_id = run_of_path(runs, store, stack_name, path)
        if run_id is None:
            raise RegistryError(f"{shown(path)} is not a stored run's adapter folder in {store}: refused")
        return stored_adapter_files(runs, store, stack_name, run_id, run_id, digest["sha256"], digest["path"])[1]

    return check


def no_store_check(path: str) -> AdapterFiles:
    """An engine started without a run store loads any adapter folder, its files read without following a link."""
    return read_adapter(Path(path))


@dataclass(frozen=True)
class EngineApp:
    """What the engine's routes share (app.state.engine)."""

    worker: Worker
    base_name: str
    default_max_tokens: int
    check: StoreCheck

    @property
    def loaded(self) -> list[str]:
        return [self.base_name, *sorted(self.worker.engine.adapters)]


def engine_of(request: Request) -> EngineApp:
    return request.app.state.engine


async def read_json(request: Request) -> dict[str, Any] | None:
    try:
        document = json.loads(await request.body())
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


async def health(request: Request) -> Any:
    worker = engine_of(request).worker
    if worker.failure or not worker.thread.is_alive():
        return JSONResponse({"status": "failed", "error": worker.failure}, status_code=503)
    return JSONResponse({"status": "ok"})


async def models(request: Request) -> Any:
    return JSONResponse({"object": "list", "data": [{"id": n, "object": "model"} for n in engine_of(request).loaded]})


async def generation_of(state: EngineApp, body: dict[str, Any], name: str) -> Generation:
    """The request as the worker's queue takes it: the prompt rendered with the chat template, sampling settings."""
    messages = [{**m, "content": m["content"] if isinstance(m.get("content"), str)
                 else "".join(str(p.get("text", "")) for p in m.get("content") or [])} for m in body["messages"]]
    temperature = body.get("temperature")
    return Generation(
        prompt_ids=await run_in_threadpool(state.worker.engine.prompt_ids, messages),
        adapter=BASE_ROW if name == state.base_name else name,
        max_tokens=int(body.get("max_tokens") or state.default_max_tokens),
        temperature=1.0 if temperature is None else float(temperature),
        top_p=float(body.get("top_p") or 1.0), seed=body.get("seed"), events=asyncio.Queue(),
        loop=asyncio.get_running_loop(), ignore_eos=bool(body.get("ignore_eos")),
    )


async def collected(events: AsyncIterator[str], name: str) -> Any:
    """One chat.completion document from the generation's stream events."""
    text, finish, usage = [], None, None
    async for line in events:
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        chunk = json.loads(payload)
        if "error" in chunk:
            return error(500, chunk["error"]["message"], "engine_error")
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            text.append(choice["delta"].get("content") or "")
            finish = choice.get("finish_reason") or finish
    return JSONResponse({"object": "chat.completion", "model": name, "usage": usage, "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "".join(text)}, "finish_reason": finish}]})


async def chat(request: Request) -> Any:
    state = engine_of(request)
    body = await read_json(request)
    if body is None or not isinstance(body.get("messages"), list):
        return error(400, "body must be a JSON object with messages", "invalid_request")
    try:
        parse_chat_request(body)
    except RequestError as problem:
        return error(problem.status, str(problem), problem.code)
    name = body.get("model")
    if name not in state.loaded:
        return error(404, f"model {name!r} is not loaded; loaded: {state.loaded}", "model_not_found")
    generation = await generation_of(state, body, name)
    state.worker.inbox.put(generation)
    events = completion_events(generation, name, bool((body.get("stream_options") or {}).get("include_usage")))
    if body.get("stream"):
        return StreamingResponse(events, media_type="text/event-stream")
    return await collected(events, name)


async def command(state: EngineApp, action: str, name: Any, files: AdapterFiles | None = None) -> Any:
    if not isinstance(name, str) or not name:
        return error(400, "lora_name (and lora_path to load) must be strings", "invalid_request")
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    state.worker.commands.put(Command(action, name, files, done, loop))
    problem = await done
    if problem:
        return error(400, problem, "invalid_adapter")
    return PlainTextResponse(f"adapter {name!r} {action}ed")


async def load_lora_adapter(request: Request) -> Any:
    state = engine_of(request)
    body = await read_json(request) or {}
    path = body.get("lora_path")
    if not isinstance(path, str) or not isinstance(body.get("lora_name"), str):
        return error(400, "lora_name (and lora_path to load) must be strings", "invalid_request")
    try:
        files = await run_in_threadpool(state.check, path)
    except ValueError as problem:  # RegistryError, AdapterFileError
        return error(400, str(problem), "not_stored")
    return await command(state, "load", body.get("lora_name"), files)


async def metrics(request: Request) -> Response:
    """vLLM's series (workloads.serve.engine.metrics) in the format the scraper's Accept header asks for."""
    body, media_type = engine_of(request).worker.metrics.render(request.headers.get("accept", ""))
    return Response(body, media_type=media_type)


async def unload_lora_adapter(request: Request) -> Any:
    body = await read_json(request) or {}
    return await command(engine_of(request), "unload", body.get("lora_name"))


def build_app(worker: Worker, base_name: str, default_max_tokens: int = 256,
              check: StoreCheck = no_store_check) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = EngineApp(worker, base_name, default_max_tokens, check)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])
    app.add_api_route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"])
    app.add_api_route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"])
    return app


def parse_lora_modules(items: list[str]) -> dict[str, Path]:
    """vLLM's JSON `--lora-modules` entries ({"name", "path", "base_model_name"}) as name -> folder."""
    named: dict[str, Path] = {}
    for item in items:
        try:
            module = json.loads(item)
        except ValueError:
            raise ValueError(f"--lora-modules {item!r}: expected JSON {{\"name\": ..., \"path\": ...}}") from None
        if not isinstance(module, dict) or not all(isinstance(module.get(k), str) for k in ("name", "path")):
            raise ValueError(f"--lora-modules {item!r}: needs string fields name and path")
        named[module["name"]] = Path(module["path"])
    return named


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, type=Path)
    parser.add_argument("--base-name", default="base")
    parser.add_argument("--lora-modules", nargs="*", default=[], help='vLLM\'s JSON form: {"name": ..., "path": ...}')
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-loras", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256, help="a request without max_tokens gets this many")
    parser.add_argument("--runs-store", type=Path, help="with --stack: runtime loads only of this store's adapters")
    parser.add_argument("--stack", help="the stack whose stored runs may be loaded at runtime")
    args = parser.parse_args(argv)
    import uvicorn

    device = "cpu" if args.device == "auto" else args.device
    engine = AdapterModel(args.base, parse_lora_modules(args.lora_modules), args.dtype, device, args.max_loras)
    metrics = EngineMetrics(args.base_name, model_context(args.base) or VLLM_DEFAULT_MAX_LEN, engine.max_loras)
    worker = Worker(engine, args.max_batch, metrics)
    worker.thread.start()
    check = store_check(args.runs_store, args.stack, args.base) if args.runs_store and args.stack else no_store_check
    app = build_app(worker, args.base_name, args.max_tokens, check)
    if key := os.environ.get(ENGINE_KEY_ENV):
        require_engine_key(app, key)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
