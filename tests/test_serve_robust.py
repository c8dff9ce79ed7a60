"""The endpoint under bad requests: a prompt past the context, malformed bodies, an abandoned huge generation,
an engine that dies, SIGTERM while a request hangs. Real gateway and real `transformers serve` (continuous
batching) on the merged SmolLM2 model, on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from eval_fixtures import children, start_server, stop_server

from documents.run_config import RunConfig
from serve_process import ENGINE_PORTS, free_port

pytestmark = pytest.mark.slow

MAX_TOKENS_LIMIT = 3000
CACHE_BLOCKS = 16  # x 256-token pages: a 4096-token KV cache per engine


@dataclass
class Launcher:
    proc: object
    url: str
    key: str
    engine_port: int
    log: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def chat(self, body: object, timeout: float = 300, **kwargs) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=self.headers, timeout=timeout, **kwargs)

    def engine_pids(self) -> list[int]:
        return children(self.proc.pid)


def _start(run: RunConfig, work: Path, **serve: object) -> Launcher:
    serve_cfg = run.serve.model_copy(update={"max_tokens_limit": MAX_TOKENS_LIMIT, "cb_num_blocks": CACHE_BLOCKS,
                                             **serve})
    run = run.model_copy(update={"serve": serve_cfg})
    key = "test-" + os.urandom(8).hex()
    engine_port = free_port(ENGINE_PORTS)
    proc, url, log = start_server(run, work, key, ["--no-base", "--backend-port", str(engine_port)])
    return Launcher(proc, url, key, engine_port, log)


@pytest.fixture(scope="module")
def launcher(trained_run: RunConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    started = _start(trained_run, tmp_path_factory.mktemp("robust"))
    try:
        yield started
    finally:
        stop_server(started.proc)


def _messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _long_prompt(run: RunConfig, tokens: int) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run.merged_dir)
    text = "The account balance moved because of fees, interest and transfers. " * (tokens // 10)
    assert len(tokenizer(text)["input_ids"]) > tokens
    return text


def test_prompt_past_the_context_is_refused_and_the_engine_lives(launcher: Launcher, trained_run: RunConfig) -> None:
    reply = launcher.chat({"model": "finetuned", "messages": _messages(_long_prompt(trained_run, 12_000)),
                           "max_tokens": 8})
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert "prompt" in message and "tokens" in message and "4096" in message, message
    assert httpx.get(f"{launcher.url}/health", timeout=10).status_code == 200
    ok = launcher.chat({"model": "finetuned", "messages": _messages("What is a bond?"), "max_tokens": 4})
    assert ok.status_code == 200, ok.text


def test_prompt_plus_max_tokens_past_the_cache_is_refused(launcher: Launcher, trained_run: RunConfig) -> None:
    prompt = _long_prompt(trained_run, 2_000)
    reply = launcher.chat({"model": "finetuned", "messages": _messages(prompt), "max_tokens": MAX_TOKENS_LIMIT})
    assert reply.status_code == 400 and "max_tokens" in reply.json()["error"]["message"], reply.text
    assert httpx.get(f"{launcher.url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize("body,field", [
    ({"model": ["finetuned"], "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": {"name": "finetuned"}, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": "finetuned", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "lots"}, "max_tokens"),
    ({"model": "finetuned"}, "messages"),
    ({"model": "finetuned", "messages": []}, "messages"),
    ({"model": "finetuned", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"model": "finetuned", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, "max_tokens"),
    ({"model": "finetuned", "messages": [{"content": "hi"}]}, "role"),
    ({"model": "finetuned", "messages": "hi"}, "messages"),
    ({"model": "finetuned", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
    (["finetuned"], "object"),
])
def test_malformed_bodies_get_a_4xx_naming_the_field(launcher: Launcher, body: object, field: str) -> None:
    reply = launcher.chat(body, timeout=30)
    assert reply.status_code in (400, 422), (reply.status_code, reply.text)
    assert field in reply.json()["error"]["message"], reply.text


def _raw_chat(launcher: Launcher, content: bytes, content_type: str = "application/json") -> httpx.Response:
    return httpx.post(f"{launcher.url}/v1/chat/completions", content=content, timeout=60,
                      headers={**launcher.headers, "Content-Type": content_type})


def test_deeply_nested_json_is_a_400_not_a_500(launcher: Launcher) -> None:
    deep = b'{"model": "finetuned", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    reply = _raw_chat(launcher, deep)
    assert reply.status_code == 400 and "nested" in reply.json()["error"]["message"], reply.text
    shallow = b'{"model": "finetuned", "messages": [{"role": "user", "content": "hi", "name": ' + b"[" * 80 \
        + b"]" * 80 + b"}]}"
    assert _raw_chat(launcher, shallow).status_code == 400
    assert httpx.get(f"{launcher.url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize("body,field", [
    (rb'{"model": "finetuned", "messages": [{"role": "user", "content": "a\ud800b"}]}', "messages.0.content"),
    (rb'{"model": "finetuned", "messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}',
     "messages.0.content.0.text"),
    (rb'{"model": "finetuned", "messages": [{"role": "user", "content": "hi"}], "stop": ["\ud83d"]}', "stop.0"),
])
def test_text_that_is_not_valid_unicode_is_a_400_naming_the_field(launcher: Launcher, body: bytes, field: str) -> None:
    reply = _raw_chat(launcher, body)
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert field in message and "surrogate" in message, message
    paired = body.replace(rb"\ud800", rb"\ud83d\ude00")
    if paired != body:  # a proper pair is one emoji: accepted
        assert _raw_chat(launcher, paired.replace(b'"finetuned",', b'"finetuned", "max_tokens": 2,')).status_code == 200


@pytest.mark.parametrize("extra", [b'"temperature": NaN', b'"tools": [{"type": "function", "weight": Infinity}]',
                                   b'"stream_options": {"x": -Infinity}'])
def test_nan_and_infinity_are_not_json_and_are_refused(launcher: Launcher, extra: bytes) -> None:
    body = b'{"model": "finetuned", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, ' + extra + b"}"
    reply = _raw_chat(launcher, body)
    assert reply.status_code == 400, reply.text
    assert "not JSON" in reply.json()["error"]["message"] and extra.split(b":")[-1].strip(b" ]}") \
        .decode().lstrip("-") in reply.json()["error"]["message"], reply.text


def test_more_than_one_choice_and_a_body_that_is_not_json_are_refused(launcher: Launcher) -> None:
    body = {"model": "finetuned", "messages": _messages("hi"), "max_tokens": 2}
    reply = launcher.chat({**body, "n": 1000}, timeout=30)
    assert reply.status_code == 400 and "n:" in reply.json()["error"]["message"], reply.text
    assert launcher.chat({**body, "n": 1}, timeout=120).status_code == 200
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        reply = _raw_chat(launcher, json.dumps(body).encode(), content_type)
        assert reply.status_code == 415 and content_type in reply.json()["error"]["message"], reply.text
    assert _raw_chat(launcher, json.dumps(body).encode(), "application/json; charset=utf-8").status_code == 200


def _sse_lines(launcher: Launcher, body: dict, on_first_chunk=None) -> list[str]:
    """Every line of a streamed reply, read raw (no SSE client library)."""
    lines: list[str] = []
    with httpx.stream("POST", f"{launcher.url}/v1/chat/completions", json=body, headers=launcher.headers,
                      timeout=300) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            lines.append(line)
            if on_first_chunk and line.startswith("data: {"):
                on_first_chunk()
                on_first_chunk = None
    return lines


def test_every_stream_ends_with_done(launcher: Launcher) -> None:
    lines = _sse_lines(launcher, {"model": "finetuned", "messages": _messages("What is a bond?"), "max_tokens": 6,
                                  "stream": True})
    events = [line for line in lines if line.strip()]
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1, lines
    assert all(line.startswith("data: {") for line in events[:-1]) and len(events) > 2, lines
    assert lines[-1] == "", lines  # the event is terminated by its blank line


def test_a_stream_broken_by_the_engine_ends_with_an_error_and_done(launcher: Launcher) -> None:
    (engine,) = launcher.engine_pids()
    body = {"model": "finetuned", "messages": _messages("Tell me a long story."), "temperature": 2.0,
            "max_tokens": 2000, "stream": True}
    lines = _sse_lines(launcher, body, on_first_chunk=lambda: os.kill(engine, signal.SIGKILL))
    events = [line for line in lines if line.strip()]
    assert events[-1] == "data: [DONE]", lines[-5:]
    error = json.loads(events[-2].removeprefix("data: "))
    assert "engine" in error["error"]["message"], events[-2]
    _wait(lambda: httpx.get(f"{launcher.url}/health", timeout=10).status_code == 200
          and launcher.engine_pids() not in ([], [engine]), "engine restarted")


def test_max_tokens_above_the_configured_cap_is_refused(launcher: Launcher) -> None:
    reply = launcher.chat({"model": "finetuned", "messages": _messages("hi"), "max_tokens": 10**9}, timeout=30)
    assert reply.status_code == 400 and str(MAX_TOKENS_LIMIT) in reply.json()["error"]["message"], reply.text


def test_body_over_the_size_limit_is_refused_unread(launcher: Launcher) -> None:
    huge = {"model": "finetuned", "messages": _messages("x" * (64 << 20))}
    reply = launcher.chat(huge, timeout=60)
    assert reply.status_code == 413 and "bytes" in reply.json()["error"]["message"], reply.text

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "finetuned", "messages": [{"role": "user", "content": "'
        for _ in range(64):
            yield b"x" * (1 << 20)
        yield b'"}]}'

    chunked = httpx.post(f"{launcher.url}/v1/chat/completions", content=chunks(), timeout=60,
                         headers={**launcher.headers, "Content-Type": "application/json"})
    assert chunked.status_code == 413, chunked.text


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _abandon_huge_generation(launcher: Launcher) -> None:
    """Send a non-streaming request for MAX_TOKENS_LIMIT sampled tokens and hang up after two seconds."""
    body = json.dumps({"model": "finetuned", "messages": _messages("Tell me a long story."), "max_tokens": MAX_TOKENS_LIMIT,
                       "temperature": 2.0}).encode()
    port = int(launcher.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     + f"Authorization: Bearer {launcher.key}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(2)


def test_abandoned_generation_stops_the_engine_work(launcher: Launcher) -> None:
    engines = launcher.engine_pids()
    start = _cpu_seconds(engines)
    time.sleep(4)
    idle = _cpu_seconds(engines) - start
    _abandon_huge_generation(launcher)
    time.sleep(3)
    before = _cpu_seconds(engines)
    time.sleep(4)
    used = _cpu_seconds(engines) - before
    assert used < idle + 1.5, f"engine used {used:.1f} CPU-seconds in 4 s after the client left ({idle:.1f} idle)"
    assert launcher.chat({"model": "finetuned", "messages": _messages("Hi"), "max_tokens": 4}).status_code == 200


def _engine_health(launcher: Launcher) -> int:
    try:
        return httpx.get(f"http://127.0.0.1:{launcher.engine_port}/health", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def _wait(condition, what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for: {what}"
        time.sleep(0.5)


def test_dead_engine_is_reported_and_restarted(trained_run: RunConfig, launcher: Launcher, tmp_path: Path) -> None:
    """Kill the CB worker the way the issue did (a long prompt sent straight to the engine), then the process."""
    prompt = _long_prompt(trained_run, 12_000)
    direct = httpx.post(f"http://127.0.0.1:{launcher.engine_port}/v1/chat/completions", timeout=300,
                        json={"model": str(trained_run.merged_dir), "messages": _messages(prompt), "max_tokens": 4})
    assert direct.status_code >= 500
    seen: set[int] = set()

    def health() -> int:
        status = httpx.get(f"{launcher.url}/health", timeout=10)
        seen.add(status.status_code)
        return status.status_code

    _wait(lambda: health() == 503 or 503 in seen, "gateway /health reports the dead engine")
    _wait(lambda: health() == 200, "engine restarted")
    assert launcher.proc.poll() is None
    assert "restart" in launcher.log.read_text()
    ok = launcher.chat({"model": "finetuned", "messages": _messages("What is a bond?"), "max_tokens": 4})
    assert ok.status_code == 200, ok.text
    (engine,) = launcher.engine_pids()
    os.kill(engine, signal.SIGKILL)
    _wait(lambda: _engine_health(launcher) == 0 or engine not in launcher.engine_pids(), "engine gone")
    _wait(lambda: health() == 200 and launcher.engine_pids() not in ([], [engine]), "engine restarted again")


def test_engine_that_keeps_dying_ends_the_launcher_non_zero(trained_run: RunConfig, tmp_path: Path) -> None:
    started = _start(trained_run, tmp_path, max_engine_restarts=0)
    try:
        (engine,) = started.engine_pids()
        os.kill(engine, signal.SIGKILL)
        assert started.proc.wait(timeout=120) != 0
        assert "engine" in started.log.read_text() and "exited" in started.log.read_text()
    finally:
        stop_server(started.proc)


def test_sigterm_with_a_hanging_request_ends_every_engine(trained_run: RunConfig, tmp_path: Path) -> None:
    started = _start(trained_run, tmp_path)
    engines = started.engine_pids()
    body = {"model": "finetuned", "messages": _messages("Tell me a long story."), "max_tokens": MAX_TOKENS_LIMIT,
            "temperature": 2.0}
    waiting = threading.Thread(target=lambda: _swallow(started.chat, body), daemon=True)
    waiting.start()
    time.sleep(3)
    os.killpg(started.proc.pid, signal.SIGTERM)
    try:
        code = started.proc.wait(timeout=60)
    except Exception:
        stop_server(started.proc)
        raise
    assert code == 128 + signal.SIGTERM, started.log.read_text()[-2000:]
    assert [pid for pid in engines if Path(f"/proc/{pid}").exists()] == []


def _swallow(call, body) -> None:
    try:
        call(body, timeout=600)
    except httpx.HTTPError:
        pass
