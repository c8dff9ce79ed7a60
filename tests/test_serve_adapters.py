"""One base, many adapters, one process: three stored runs' adapters of the tiny model served by the peft engine
behind the real gateway, over real HTTP. Answers against a server that holds one adapter at a time; runtime load and
unload under streaming load; refusals (another base, bad admin requests); per-adapter figures."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from adapter_fixtures import ADAPTERS, SPARE, AdapterRuns, AdapterServer, adapter_server
from eval_fixtures import ROOT

from serve_process import free_port

pytestmark = pytest.mark.slow

NAMES = list(ADAPTERS)
PROMPTS = ["What is a bond?", "Summarise the quarter's earnings in one line."]


def greedy(server: AdapterServer, model: str, prompt: str, max_tokens: int = 12) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=server.headers, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def multi(adapter_runs: AdapterRuns, tmp_path_factory: pytest.TempPathFactory):
    metrics = tmp_path_factory.mktemp("textfile")
    env = {"FTSTACK_METRICS_TEXTFILE_DIR": str(metrics), "SLURM_JOB_ID": "4242"}
    with adapter_server(adapter_runs, tmp_path_factory.mktemp("multi"), NAMES, extra_env=env) as server:
        server.metrics_dir = metrics
        yield server


def test_each_adapter_answers_as_when_served_alone(adapter_runs, multi, tmp_path) -> None:
    together = {(name, p): greedy(multi, name, p) for name in NAMES for p in PROMPTS}
    jobs = [(name, p) for name in ["base", *NAMES] for p in PROMPTS]
    with ThreadPoolExecutor(len(jobs)) as pool:  # at once: rows of different adapters decoded in one batch
        mixed = dict(zip(jobs, pool.map(lambda job: greedy(multi, *job), jobs)))
    assert {job: mixed[job] for job in together} == together
    # one server holds one adapter at a time: the first from its command line, each next one loaded at runtime
    # after the one before is unloaded (one server start instead of one per adapter)
    with adapter_server(adapter_runs, tmp_path / "alone", NAMES[:1]) as alone:
        for before, name in zip([None, *NAMES], NAMES):
            if before is not None:
                admin = f"{alone.url}/admin/adapters"
                assert httpx.delete(f"{admin}/{before}", headers=alone.headers, timeout=300).status_code == 200
                loaded = httpx.post(admin, headers=alone.headers, timeout=300,
                                    json={"name": name, "run_id": f"run-{name}"})
                assert loaded.status_code == 200, loaded.text
            cards = httpx.get(f"{alone.url}/v1/models", headers=alone.headers, timeout=10).json()["data"]
            assert {card["id"] for card in cards} == {"base", name}
            for prompt in PROMPTS:
                assert greedy(alone, name, prompt) == together[(name, prompt)], (name, prompt)
    base = {p: greedy(multi, "base", p) for p in PROMPTS}
    for prompt in PROMPTS:
        answers = [together[(name, prompt)] for name in NAMES]
        assert len(set(answers)) == len(NAMES) and base[prompt] not in answers, answers


def test_models_list_every_adapter_with_its_run(multi) -> None:
    assert httpx.get(f"{multi.url}/v1/models", timeout=10).status_code == 401
    cards = {m["id"]: m for m in httpx.get(f"{multi.url}/v1/models", headers=multi.headers, timeout=10).json()["data"]}
    assert set(cards) == {"base", *NAMES}
    for name, rank in ADAPTERS.items():
        assert cards[name]["run_id"] == f"run-{name}" and cards[name]["rank"] == rank
        assert cards[name]["dataset_sha256"] == f"{rank:064x}"
    unknown = httpx.post(f"{multi.url}/v1/chat/completions", headers=multi.headers, timeout=10,
                         json={"model": "desk-nope", "messages": [{"role": "user", "content": "hi"}]})
    assert unknown.status_code == 404
    assert all(name in unknown.json()["error"]["message"] for name in ["base", *NAMES])


def stream(server: AdapterServer, model: str, results: list, index: int, first: threading.Event) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[index % 2]}], "max_tokens": 160,
            "temperature": 0.0, "stream": True}
    lines: list[str] = []
    try:
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=server.headers,
                          timeout=300) as reply:
            status = reply.status_code
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    lines.append(line)
                    first.set()
    except httpx.HTTPError as exc:
        status = repr(exc)
    finally:
        first.set()
    results[index] = (status, lines, time.monotonic())


def test_load_and_unload_while_eight_streams_run(multi) -> None:
    """The adapter is loaded once every stream has its first token (an event per stream, not a fixed pause that a
    loaded machine outlasts before the streams begin)."""
    models = ["base", *NAMES] * 2
    results: list = [None] * len(models)
    first = [threading.Event() for _ in models]
    threads = [threading.Thread(target=stream, args=(multi, m, results, i, first[i])) for i, m in enumerate(models)]
    for thread in threads:
        thread.start()
    assert all(event.wait(300) for event in first)
    loaded = httpx.post(f"{multi.url}/admin/adapters", headers=multi.headers, timeout=300,
                        json={"name": SPARE, "run_id": f"run-{SPARE}"})
    loaded_at = time.monotonic()
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["run_id"] == f"run-{SPARE}"
    assert greedy(multi, SPARE, PROMPTS[0], 4)
    gone = httpx.delete(f"{multi.url}/admin/adapters/{SPARE}", headers=multi.headers, timeout=300)
    assert gone.status_code == 200, gone.text
    for thread in threads:
        thread.join(timeout=300)
    assert loaded_at < max(ended for _, _, ended in results), "the load waited for every stream to end"
    for model, (status, lines, _) in zip(models, results):
        assert status == 200, (model, status)
        assert lines[-1] == "data: [DONE]", (model, lines[-3:])
        finish = [json.loads(line[5:])["choices"][0]["finish_reason"] for line in lines[:-1]
                  if json.loads(line[5:]).get("choices")]
        assert finish[-1] in ("stop", "length") and not any("error" in line for line in lines), (model, lines[-4:])
    after = httpx.post(f"{multi.url}/v1/chat/completions", headers=multi.headers, timeout=10,
                       json={"model": SPARE, "messages": [{"role": "user", "content": "hi"}]})
    assert after.status_code == 404 and SPARE not in after.json()["error"]["message"].split("choose one of")[1]
    listed = {m["id"] for m in httpx.get(f"{multi.url}/v1/models", headers=multi.headers, timeout=10).json()["data"]}
    assert listed == {"base", *NAMES}


def test_bad_admin_requests_get_4xx(adapter_runs, multi) -> None:
    admin = f"{multi.url}/admin/adapters"
    good = {"name": "desk-x", "run_id": f"run-{SPARE}"}
    assert httpx.post(admin, json=good, timeout=10).status_code == 401
    assert httpx.post(admin, json=good, headers={"Authorization": "Bearer nope"}, timeout=10).status_code == 401
    assert httpx.delete(f"{admin}/{NAMES[0]}", timeout=10).status_code == 401
    cases = [
        (b"not json", 400, "not JSON"),
        (b"[" * 50_000, 400, "not JSON"),  # nesting past the recursion limit: a 400, not a 500
        (json.dumps({"name": "desk-x"}).encode(), 400, "run_id"),
        (json.dumps(["desk-x"]).encode(), 400, "object"),
        (json.dumps({"name": "../etc", "run_id": f"run-{SPARE}"}).encode(), 400, "only letters, digits"),
        (json.dumps({"name": "desk-x", "run_id": "run-missing"}).encode(), 404, "run-missing"),
        (json.dumps({"name": NAMES[0], "run_id": f"run-{SPARE}"}).encode(), 409, "already served"),
    ]
    for body, status, words in cases:
        reply = httpx.post(admin, content=body, headers=multi.headers, timeout=30)
        assert reply.status_code == status and words in reply.json()["error"]["message"], (body, reply.text)
    assert httpx.delete(f"{admin}/desk-missing", headers=multi.headers, timeout=10).status_code == 404
    assert httpx.delete(f"{admin}/base", headers=multi.headers, timeout=10).status_code == 404
    foreign = httpx.post(admin, json={"name": "desk-foreign", "run_id": adapter_runs.foreign_run},
                         headers=multi.headers, timeout=30)
    assert foreign.status_code == 400
    assert "desk-foreign" in foreign.json()["error"]["message"] and "other" in foreign.json()["error"]["message"]


def test_an_adapter_of_another_base_is_refused_at_start(adapter_runs, tmp_path) -> None:
    import subprocess
    import sys

    config = tmp_path / "run.json"
    config.write_text(adapter_runs.run.model_dump_json())
    done = subprocess.run(
        [sys.executable, "-m", "workloads.serve.launcher.launch", "--config", str(config), "--port", str(free_port()),
         "--adapter", f"{NAMES[0]}=run-{NAMES[0]}", "--adapter", f"desk-foreign={adapter_runs.foreign_run}"],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    message = done.stderr
    assert "desk-foreign" in message and str(adapter_runs.run.base_model_dir) in message and "other" in message


def test_admin_is_closed_without_a_key_even_on_loopback(adapter_runs, tmp_path) -> None:
    with adapter_server(adapter_runs, tmp_path / "nokey", [NAMES[0]], key=None) as open_server:
        reply = httpx.post(f"{open_server.url}/admin/adapters", json={"name": "x", "run_id": f"run-{SPARE}"}, timeout=10)
        assert reply.status_code == 403 and "API key" in reply.json()["error"]["message"]


def test_figures_per_adapter(multi, adapter_runs) -> None:
    for name in NAMES[:2]:
        greedy(multi, name, PROMPTS[0], 6)
    served = adapter_runs.run.results_dir / "served_adapters.json"
    metrics = multi.metrics_dir / "ftstack_job_4242_serve.prom"

    def reported() -> tuple[dict, str]:
        """The served set and the metrics file as the reporter last wrote them (the set first, the metrics after)."""
        return (json.loads(served.read_text()) if served.exists() else {},
                metrics.read_text() if metrics.exists() else "")

    deadline = time.monotonic() + 300  # the reporter writes every 5 s; a loaded machine may take many times that
    document, prom = reported()
    while not all((document.get("speed") or {}).get(n, {}).get("requests")
                  and f'ftstack_serve_requests{{hpc_job="4242",stage="serve",adapter="{n}"}}' in prom
                  for n in NAMES[:2]):
        assert time.monotonic() < deadline, (document, prom)
        time.sleep(0.5)
        document, prom = reported()
    assert {a["name"] for a in document["adapters"]} == set(NAMES)
    for name in NAMES[:2]:
        speed = document["speed"][name]
        assert speed["requests"] >= 1 and speed["completion_tokens"] >= 1 and speed["tokens_per_second"] > 0
        assert speed["time_to_first_token_s"] > 0
    for name in NAMES[:2]:
        assert f'ftstack_serve_requests{{hpc_job="4242",stage="serve",adapter="{name}"}}' in prom
        assert f'ftstack_serve_time_to_first_token_s{{hpc_job="4242",stage="serve",adapter="{name}"}}' in prom


def test_ftstack_runs_lists_the_stored_adapters(adapter_runs) -> None:
    from infra.commands.runs import adapter_entries, format_adapters
    from infra.runs.store import LocalStore, list_runs

    store = LocalStore(adapter_runs.store_dir)
    found, damaged = adapter_entries(store, "local", list_runs(store, "local"))
    entries = {e.run_id: e for e in found}
    assert damaged == []
    assert set(entries) == {f"run-{name}" for name in [*ADAPTERS, SPARE]} | {adapter_runs.foreign_run}
    base_sha = entries[f"run-{NAMES[0]}"].base_model_sha256
    for name, rank in ADAPTERS.items():
        entry = entries[f"run-{name}"]
        assert entry.rank == rank and entry.dataset_sha256 == f"{rank:064x}" and entry.base_model_sha256 == base_sha
        assert Path(entry.adapter_dir, "adapter_config.json").is_file()
    assert entries[adapter_runs.foreign_run].base_model_sha256 != base_sha
    table = format_adapters(list(entries.values()))
    assert table.splitlines()[0].startswith("adapter (run id)") and f"run-{NAMES[1]}" in table


def test_a_seed_out_of_range_fails_alone(multi) -> None:
    """Issue 42, item 1: a seed past 64 bits overflowed torch's generator in the engine's batching thread, which
    failed the requests batched with it and, four times over, the server. Refused at the gateway (vLLM's range,
    torch.long), while requests beside it are answered and the engine stays up."""
    url = f"{multi.url}/v1/chat/completions"

    def ask(seed: object) -> httpx.Response:
        body = {"model": NAMES[0], "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 6,
                "temperature": 0.8, "seed": seed}
        return httpx.post(url, json=body, headers=multi.headers, timeout=120)

    bad = [2**64, 2**63, -(2**63) - 1, 10**33, 1e33]
    good = [7, 2**63 - 1, -(2**63)]
    with ThreadPoolExecutor(len(bad) + len(good)) as pool:  # more bad seeds than the supervisor's restarts allow
        replies = list(pool.map(ask, [*good, *bad]))
    for seed, reply in zip([*good, *bad], replies):
        if seed in good:
            assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"], (seed, reply.text)
        else:
            assert reply.status_code == 400 and reply.json()["error"]["message"].startswith("seed:"), (seed, reply.text)
    health = httpx.get(f"{multi.url}/health", timeout=10)
    assert health.status_code == 200 and set(health.json()["models"].values()) == {"ok"}, health.text


def test_adapter_names_are_bounded_and_runs_come_from_the_served_stack(adapter_runs, multi, tmp_path) -> None:
    """Issue 42, item 5: a 10,000-character name was accepted; model ids stop at 64 characters (OpenAI's
    fine-tune suffix), and the refusal does not echo the whole name. A run of another stack in the store (the
    rehearsal cluster's) was loaded by the local server, and of two stacks with the same run id the one whose
    stack sorts last was served without a word: the server serves its own stack's runs and refuses others, on
    both load routes, naming the run's stack."""
    from adapter_runs import register_run, save_adapter

    from documents.run_record import read_run_record
    from infra.runs.store import LocalStore

    admin = f"{multi.url}/admin/adapters"
    for name in ["a" * 10_000, "a" * 65]:
        reply = httpx.post(admin, json={"name": name, "run_id": f"run-{SPARE}"}, headers=multi.headers, timeout=30)
        message = reply.json()["error"]["message"]
        assert reply.status_code == 400 and f"is {len(name)} characters long" in message and "at most 64" in message
        assert len(message) < 300, message

    base = Path(adapter_runs.run.model.source.removeprefix("dir:"))
    save_adapter(base, tmp_path / "other-stack-adapter", 4, seed=5)
    store = LocalStore(adapter_runs.store_dir)
    register_run(store, tmp_path / "cluster", "run-rehearsal", base, tmp_path / "other-stack-adapter", 4, stack="cluster")
    register_run(store, tmp_path / "prod", f"run-{SPARE}", base, tmp_path / "other-stack-adapter", 4, stack="prod")
    rehearsal = adapter_runs.store_dir / "runs" / "cluster" / "run-rehearsal" / "adapter"
    for route, body in [(admin, {"name": "desk-rehearsal", "run_id": "run-rehearsal"}),
                        (f"{multi.url}/v1/load_lora_adapter", {"lora_name": "desk-rehearsal", "lora_path": "run-rehearsal"}),
                        (f"{multi.url}/v1/load_lora_adapter", {"lora_name": "desk-rehearsal", "lora_path": str(rehearsal)})]:
        reply = httpx.post(route, json=body, headers=multi.headers, timeout=300)
        message = reply.json()["error"]["message"]
        assert reply.status_code == 400, (route, reply.text)
        assert "run 'run-rehearsal' is a run of stack 'cluster'" in message and "serves stack 'local'" in message

    longest = "d" * 64
    loaded = httpx.post(admin, json={"name": longest, "run_id": f"run-{SPARE}"}, headers=multi.headers, timeout=300)
    assert loaded.status_code == 200, loaded.text
    stored = {stack: read_run_record((adapter_runs.store_dir / "runs" / stack / f"run-{SPARE}" / "run.json").read_text(),
                                     "run.json") for stack in ("local", "prod")}
    assert stored["local"].adapter_sha256 != stored["prod"].adapter_sha256
    card = loaded.json()
    assert (card["stack"], card["adapter_sha256"]) == ("local", stored["local"].adapter_sha256), card
    cards = {m["id"]: m for m in httpx.get(f"{multi.url}/v1/models", headers=multi.headers, timeout=10).json()["data"]}
    assert "desk-rehearsal" not in cards and cards[NAMES[0]]["stack"] == "local"
    assert httpx.delete(f"{admin}/{longest}", headers=multi.headers, timeout=300).status_code == 200


def test_long_adapter_names_are_refused_in_the_run_config_and_flags() -> None:
    from documents.sections.serve import ServeConfig
    from workloads.serve.registry import RegistryError, parse_adapter_flags

    assert parse_adapter_flags([f"{'n' * 64}=run-1"]) == {"n" * 64: "run-1"}
    with pytest.raises(RegistryError, match="is 65 characters long; a model name has at most 64"):
        parse_adapter_flags([f"{'n' * 65}=run-1"])
    with pytest.raises(ValueError, match="adapter name is 10000 characters long"):
        ServeConfig(adapters={"n" * 10_000: "run-1"})
    with pytest.raises(ValueError, match="is 65 characters long"):
        ServeConfig(base_name="b" * 65)


def accepted_connections(pid: int, port: int) -> int:
    """How many established TCP connections on local `port` process `pid` holds (it has accepted them): with the
    request's bytes already in their socket (the client's trace said so), the server reads them before it sees a
    SIGTERM sent afterwards, so the request is in flight, not dropped as an idle connection."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            count += local_port == port and fields[3] == "01" and fields[9] in inodes
    return count


def test_sigterm_ends_requests_in_flight_like_openai(adapter_runs, tmp_path) -> None:
    """Issue 42, item 6: after the grace period a non-streaming request got a plain-text 500 and a stream was cut
    without an error or `data: [DONE]`, with CancelledError tracebacks in the log. Now: a JSON 503 and an error
    event then `data: [DONE]`; the launcher ends its engine and exits as Slurm's SIGTERM asks."""
    import dataclasses
    import signal

    from eval_fixtures import children

    serve = adapter_runs.run.serve.model_copy(update={"shutdown_grace_s": 1.0, "max_tokens_limit": 1800})
    runs = dataclasses.replace(adapter_runs, run=adapter_runs.run.model_copy(update={"serve": serve}))
    with adapter_server(runs, tmp_path / "sigterm", [NAMES[0]]) as server:
        engines = children(server.proc.pid)
        body = {"model": NAMES[0], "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 1800,
                "temperature": 1.0, "ignore_eos": True}  # neither ends on its own before the grace period does
        url = f"{server.url}/v1/chat/completions"
        whole: list[httpx.Response] = []
        sent = threading.Event()

        def trace(event: str, info: dict) -> None:
            if event == "http11.send_request_body.complete":
                sent.set()

        def post_whole() -> None:
            with httpx.Client(timeout=120) as client:
                whole.append(client.post(url, json=body, headers=server.headers, extensions={"trace": trace}))

        waiting = threading.Thread(target=post_whole)
        lines: list[str] = []
        with httpx.stream("POST", url, json={**body, "stream": True}, headers=server.headers, timeout=120) as reply:
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    lines.append(line)
                if lines and not waiting.ident:
                    waiting.start()  # waits behind the stream's generation: in flight at the gateway
                    assert sent.wait(60), "the second request was never sent"
                    port = int(server.url.rsplit(":", 1)[1])
                    deadline = time.monotonic() + 60
                    while accepted_connections(server.proc.pid, port) < 2:  # both requests' sockets accepted
                        assert time.monotonic() < deadline, "the gateway never accepted the second request"
                        time.sleep(0.05)
                    os.killpg(server.proc.pid, signal.SIGTERM)
        waiting.join(timeout=60)
        code = server.proc.wait(timeout=60)
    log = server.log.read_text()
    assert code == 128 + signal.SIGTERM, log[-2000:]
    assert [pid for pid in engines if Path(f"/proc/{pid}").exists()] == []
    assert lines[-1] == "data: [DONE]", lines[-3:]
    assert json.loads(lines[-2][5:])["error"]["code"] == "server_shutting_down", lines[-3:]
    assert whole[0].status_code == 503 and whole[0].json()["error"]["code"] == "server_shutting_down", whole[0].text
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]


def test_ignore_eos_reaches_the_peft_engine(multi) -> None:
    """Issue 42, item 12: the gateway forwards vLLM's `ignore_eos` to the engines that take it; the reply has
    max_tokens tokens by the engine's own count, streamed or not."""
    from workloads.serve.clients.openai_client import stream_chat

    body = {"model": NAMES[0], "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 9,
            "temperature": 0.0, "ignore_eos": True}
    reply = httpx.post(f"{multi.url}/v1/chat/completions", json=body, headers=multi.headers, timeout=120)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 9, reply.text
    assert reply.json()["choices"][0]["finish_reason"] == "length"
    *_, streamed = stream_chat(f"{multi.url}/v1", "base", body["messages"], multi.key, max_tokens=9, ignore_eos=True)
    assert streamed.completion_tokens == 9
