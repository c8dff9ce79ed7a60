"""The peft engine's /metrics (issue 53, item 4): vLLM's `vllm:*` series counting what the replies say. The real
engine on SmolLM2 behind the real gateway (the launcher, engine peft), one stored adapter of it served; requests few
and short, one at a time. Counts are checked against the tokenizer's own count of each prompt, the replies'
`usage` and `finish_reason`, and the steps a reply takes; the gateway's /metrics relays the engine's. That these
names, types and labels are vLLM's own is checked against a real vLLM in tests/test_serve_vllm.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from adapter_runs import STACK, register_run, save_adapter
from eval_fixtures import start_server, stop_server
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from documents.run_config import parse_run_config
from documents.sections.serve import ServeConfig
from infra.runs.store import LocalStore
from workloads.serve.engine.metrics import EngineMetrics
from workloads.serve.gateway.app import build_gateway
from workloads.serve.launcher.engine_plan import base_route
from serve_process import ENGINE_PORTS, free_port

pytestmark = pytest.mark.slow

KEY = "metrics-gateway-key"
ADAPTER = "desk-metrics"
MAX_LORAS = 8
LONG = [{"role": "user", "content": "What is a bond?"}]
SHORT = [{"role": "user", "content": "What is 2+2? Answer with one number only."}]
"""greedy SmolLM2 answers "The answer is 4." and ends with its end-of-sequence token"""
ENGINE = {"model_name": "base", "engine": "0"}
HUNG_UP_TOKENS = 1024
"""the hung-up request's max_tokens: far more steps than the hang-up takes to reach the engine, even on two busy
shared cores (the gateway closes its request to the engine as the client hangs up: tests/test_serve_stream_end.py)"""


@dataclass
class MetricsServer:
    proc: object
    url: str
    engine_url: str
    headers = {"Authorization": f"Bearer {KEY}"}

    def chat(self, model: str, messages: list[dict], max_tokens: int, **fields: object) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/chat/completions", headers=self.headers, timeout=300, json={
            "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, **fields})


@pytest.fixture(scope="module")
def server(smollm2_base_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsServer]:
    """SmolLM2 served by the peft engine (float32 on CPU) with one stored rank-4 adapter of it."""
    root = tmp_path_factory.mktemp("engine-metrics")
    (root / "model").mkdir()
    (root / "model" / "base").symlink_to(smollm2_base_dir)
    adapter = save_adapter(smollm2_base_dir, root / "adapters" / ADAPTER, 4, seed=31)
    register_run(LocalStore(root / "store"), root / "runs", f"run-{ADAPTER}", smollm2_base_dir, adapter, 4)
    run = parse_run_config({
        "name": "metrics", "paths": {"root": str(root), "model_dir": str(root / "model")},
        "model": {"source": f"dir:{smollm2_base_dir}"}, "data": {"source": "sample", "rows": 4},
        "serve": {"engine": "peft", "device": "cpu", "dtype": "float32", "runs_store": str(root / "store"),
                  "stack": STACK, "max_tokens_limit": HUNG_UP_TOKENS, "max_loras": MAX_LORAS},
    }, "test_serve_engine_metrics")
    engine_port = free_port(ENGINE_PORTS)
    proc, url, _ = start_server(run, root, KEY, ["--adapter", f"{ADAPTER}=run-{ADAPTER}", "--backend-port",
                                                 str(engine_port)], timeout_s=300)
    try:
        yield MetricsServer(proc, url, f"http://127.0.0.1:{engine_port}")
    finally:
        stop_server(proc)


class Series(dict):
    """The `vllm:*` samples of one scrape: (sample name, sorted labels) -> value."""

    @classmethod
    def parse(cls, text: str) -> Series:
        return cls({(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                    for family in text_string_to_metric_families(text) if family.name.startswith("vllm:")
                    for sample in family.samples})

    def of(self, name: str, **labels: str) -> float:
        return self[(name, tuple(sorted({**ENGINE, **labels}.items())))]

    def named(self, name: str) -> dict[tuple, float]:
        return {labels: value for (sample, labels), value in self.items() if sample == name}


def scrape(url: str, headers: dict[str, str] | None = None) -> Series:
    reply = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=30)
    assert reply.status_code == 200, reply.text
    return Series.parse(reply.text)


def settled(url: str) -> Series:
    """A scrape once no request runs or waits (the gauges are read as the scrape comes). No deadline: each request
    ends by itself (at the end of its tokens at the latest), however busy the machine."""
    while True:
        series = scrape(url)
        if series.of("vllm:num_requests_running") == 0 == series.of("vllm:num_requests_waiting"):
            return series
        time.sleep(0.2)


def families(text: str) -> dict[str, tuple[str, frozenset]]:
    """name -> (type, the label names of each sample kind), for the `vllm:*` families."""
    return {family.name: (family.type, frozenset((s.name, frozenset(s.labels)) for s in family.samples))
            for family in text_string_to_metric_families(text) if family.name.startswith("vllm:")}


def streamed(server: MetricsServer, model: str, messages: list[dict], max_tokens: int) -> tuple[dict, str]:
    """A streamed reply's usage and finish_reason."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", headers=server.headers, json=body,
                      timeout=300) as reply:
        lines = [line[5:].strip() for line in reply.iter_lines() if line.startswith("data:")]
    chunks = [json.loads(line) for line in lines if line != "[DONE]"]
    (usage,) = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    (finish,) = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c.get("finish_reason")]
    return usage, finish


def test_the_series_count_what_the_replies_say(server: MetricsServer, smollm2_base_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_base_dir)
    started = time.time()
    before = settled(server.engine_url)
    replies = []
    for model, messages, max_tokens in ((ADAPTER, LONG, 3), ("base", SHORT, 24)):
        reply = server.chat(model, messages, max_tokens)
        assert reply.status_code == 200, reply.text
        replies.append((messages, max_tokens, reply.json()["usage"], reply.json()["choices"][0]["finish_reason"]))
    replies.append((LONG, 4, *streamed(server, "base", LONG, 4)))
    after = settled(server.engine_url)

    assert [finish for *_, finish in replies] == ["length", "stop", "length"]
    assert replies[1][2]["completion_tokens"] < 24
    for messages, max_tokens, usage, finish in replies:
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        assert usage["prompt_tokens"] == len(rendered["input_ids"])
        assert finish == "stop" or usage["completion_tokens"] == max_tokens

    def delta(name: str, **labels: str) -> float:
        return after.of(name, **labels) - before.of(name, **labels)

    prompt = sum(usage["prompt_tokens"] for _, _, usage, _ in replies)
    generated = sum(usage["completion_tokens"] for _, _, usage, _ in replies)
    # a reply ending on the end-of-sequence token took one step more than its usage counts
    steps = generated + sum(finish == "stop" for *_, finish in replies)
    assert delta("vllm:prompt_tokens_total") == prompt and delta("vllm:generation_tokens_total") == generated
    assert {reason: delta("vllm:request_success_total", finished_reason=reason)
            for reason in ("stop", "length", "abort", "error")} == {"stop": 1, "length": 2, "abort": 0, "error": 0}
    for name in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds", "request_inference_time_seconds", "time_to_first_token_seconds",
                 "request_time_per_output_token_seconds", "request_prompt_tokens", "request_generation_tokens",
                 "request_max_num_generation_tokens", "request_params_n", "request_params_max_tokens"):
        assert delta(f"vllm:{name}_count") == len(replies), name
    assert delta("vllm:request_prompt_tokens_sum") == prompt
    assert delta("vllm:request_generation_tokens_sum") == generated
    assert delta("vllm:request_params_max_tokens_sum") == 3 + 24 + 4
    assert delta("vllm:request_params_n_sum") == len(replies)
    assert delta("vllm:inter_token_latency_seconds_count") == steps - len(replies)
    # one at a time: a prefill, then one forward per further token
    assert delta("vllm:iteration_tokens_total_count") == steps
    assert delta("vllm:iteration_tokens_total_sum") == prompt + steps
    assert delta("vllm:e2e_request_latency_seconds_sum") >= delta("vllm:request_inference_time_seconds_sum") > 0

    lora = after.named("vllm:lora_requests_info")
    assert {labels for labels in lora} >= {
        (("max_lora", str(MAX_LORAS)), ("running_lora_adapters", ADAPTER), ("waiting_lora_adapters", "")),
        (("max_lora", str(MAX_LORAS)), ("running_lora_adapters", ""), ("waiting_lora_adapters", ""))}
    assert max(lora.values()) >= started

    assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 401
    assert scrape(server.url, server.headers) == after
    engine_text = httpx.get(f"{server.engine_url}/metrics", timeout=30).text
    assert families(engine_text) == families(EngineMetrics("base", 8192, MAX_LORAS).render("")[0].decode())


def test_a_client_hanging_up_counts_as_an_abort(server: MetricsServer) -> None:
    """The client reads one token of a 1,024-token request and hangs up: the engine ends the request as an abort at
    its next token after the hang-up reaches it, long before its last. Counted in tokens, not seconds: the request
    ends either way (abort, or `length` after all its tokens), and the test waits for that."""
    before = settled(server.engine_url)
    body = {"model": "base", "messages": LONG, "max_tokens": HUNG_UP_TOKENS, "ignore_eos": True, "stream": True}
    received = 0
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", headers=server.headers, json=body,
                      timeout=300) as reply:
        for line in reply.iter_lines():
            if line.startswith("data:") and json.loads(line[5:])["choices"][0]["delta"].get("content"):
                received += 1
                break
    after = settled(server.engine_url)

    def moved(name: str, **labels: str) -> float:
        return after.of(name, **labels) - before.of(name, **labels)

    generated = moved("vllm:generation_tokens_total")
    ended = {reason: moved("vllm:request_success_total", finished_reason=reason) for reason in ("abort", "stop", "length")}
    assert ended == {"abort": 1, "stop": 0, "length": 0}, f"{ended}; {generated:.0f} tokens generated, {received} read"
    assert received == 1 and generated < HUNG_UP_TOKENS / 2, (
        f"{generated - received:.0f} tokens generated after the client hung up, of {HUNG_UP_TOKENS}")
    assert moved("vllm:e2e_request_latency_seconds_count") == 1


def test_the_engines_metrics_are_open_like_vllms(server: MetricsServer) -> None:
    """vLLM's --api-key guards /v1 only (vllm/entrypoints/serve/middleware/authenticate.py): its /metrics, like
    /health, answers without the key, and so does the peft engine's, which listens on loopback only."""
    assert httpx.get(f"{server.engine_url}/v1/models", timeout=30).status_code == 401
    reply = httpx.get(f"{server.engine_url}/metrics", timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    openmetrics = httpx.get(f"{server.engine_url}/metrics", headers={"Accept": "application/openmetrics-text"},
                            timeout=30)
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")


def test_a_transformers_gateway_has_no_vllm_series(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    route = base_route(base, "http://127.0.0.1:9", ServeConfig(), "transformers")
    with TestClient(build_gateway([route], KEY)) as client:
        reply = client.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 404 and "transformers serve" in reply.json()["error"]["message"]
