"""Engine processes behind the gateway, as pure plans: one process holding the base and every adapter (vLLM
with LoRA on GPU, the peft engine on CPU), or `transformers serve` per model.

vLLM serves the base weights and the adapters (`--enable-lora`, one `--lora-modules` entry each) from one
process under their names, and loads or unloads adapters at runtime (VLLM_ALLOW_RUNTIME_LORA_UPDATING) when the
gateway's admin route asks. The peft engine (workloads.serve.engine.server) does the same on CPU.
transformers serve runs one continuous-batching model per process (switching models inside one process stops
and restarts its batching worker), so base and the merged fine-tune each get their own process: a full model
copy per fine-tune, kept for the run's own merged model only.
Both render prompts themselves: each is started with the chat template's thinking switch off where the template
has one (workloads.common.chat_template), as training rendered them; the gateway forwards no
`chat_template_kwargs` of a request, so no client turns it back on.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from documents.adapter_registry import AdapterEntry
from documents.hf_files import read_adapter_config, write_adapter_config
from documents.run_config import RunConfig
from documents.sections.serve import VLLM_LORA_RANKS, ServeConfig
from planning.serving import derived_rank, rank_limit, served_ranks
from workloads.common.chat_template import folder_options
from workloads.serve.launcher.vllm_install import FLAG_SINCE, VllmInstall, VllmMissing, find_vllm
from workloads.serve.route import Route
from workloads.serve.token_budget import TokenBudget, token_budget

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "config.json")

CPU_CACHE_SHARE = 0.1


@dataclass(frozen=True)
class EnginePlan:
    label: str
    argv: list[str]
    port: int
    routes: list[Route] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def vllm_python(serve_config: ServeConfig) -> str:
    return serve_config.vllm_python or sys.executable


def choose_engine(serve_config: ServeConfig) -> str:
    """auto: vLLM where the serving environment holds it and a GPU is present, else peft."""
    if serve_config.engine != "auto":
        return serve_config.engine
    import torch

    if not torch.cuda.is_available():
        return "peft"
    try:
        find_vllm(vllm_python(serve_config))
    except VllmMissing:
        return "peft"
    return "vllm"


def on_cpu(device: str) -> bool:
    if device != "auto":
        return device == "cpu"
    import torch

    return not torch.cuda.is_available()


def cb_flags(serve_config: ServeConfig) -> list[str]:
    """KV cache sizing. Unbounded, transformers takes 60% of free RAM per CPU engine: two engines exhaust it."""
    flags = []
    for flag, value in (("--cb-num-blocks", serve_config.cb_num_blocks),
                        ("--cb-max-batch-tokens", serve_config.cb_max_batch_tokens),
                        ("--cb-max-memory-percent", serve_config.cb_max_memory_percent)):
        if value is not None:
            flags += [flag, str(value)]
    if not flags and on_cpu(serve_config.device):
        flags = ["--cb-max-memory-percent", str(CPU_CACHE_SHARE)]
    return flags


def template_flag(flag: str, folder: Path) -> list[str]:
    """`flag` with the folder's thinking switches off as JSON (vLLM's --default-chat-template-kwargs and
    transformers serve's --chat-template-kwargs both json.loads it); nothing for a template without one."""
    options = folder_options(folder)
    return [flag, json.dumps(options)] if options else []


def transformers_argv(folder: Path, port: int, serve_config: ServeConfig, quantization: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(folder),
            "--host", "127.0.0.1", "--port", str(port), "--device", serve_config.device, "--dtype", serve_config.dtype,
            "--log-level", "warning", *template_flag("--chat-template-kwargs", folder)]
    if serve_config.continuous_batching:
        argv += ["--continuous-batching", *cb_flags(serve_config)]
    if quantization:
        argv += ["--quantization", quantization]
    return argv


def require_folder(path: Path, marker: str, stage: str) -> Path:
    if not (path / marker).exists():
        raise FileNotFoundError(f"{path}: no {marker} (run the {stage} stage first)")
    return path


def adapter_view(run: RunConfig, target: Path) -> Path:
    """A folder `transformers serve` loads as base + unmerged adapter (transformers' PEFT integration): the
    adapter files beside the base's config, tokenizer and (symlinked) weights."""
    adapter = require_folder(run.adapter_dir, "adapter_config.json", "train")
    base = require_folder(run.base_model_dir, "config.json", "prepare")
    target.mkdir(parents=True, exist_ok=True)
    for item in adapter.iterdir():
        if item.name.startswith("adapter_model"):
            shutil.copy2(item, target / item.name)
    config = read_adapter_config(adapter)
    write_adapter_config(target, config.model_copy(update={"base_model_name_or_path": str(base)}))
    for name in TOKENIZER_FILES:
        if (base / name).exists():
            shutil.copy2(base / name, target / name)
    for weights in [*base.glob("*.safetensors"), *base.glob("*.safetensors.index.json")]:
        (target / weights.name).symlink_to(weights.resolve())
    return target


def ignore_eos_body(folder: Path) -> dict[str, str]:
    """transformers serve knows no `ignore_eos`: a request's `generation_config` (JSON) replaces the model's, so
    it is the folder's own with no end-of-sequence token (-1: none, in continuous batching's requests)."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(folder)
    except OSError:
        config = GenerationConfig()
    config.eos_token_id = -1
    return {"generation_config": json.dumps(config.to_diff_dict())}


def route(name: str, port: int, folder: Path, kind: str, serve_config: ServeConfig) -> Route:
    """A transformers engine's route: the gateway counts prompts with the folder's tokenizer against its budget."""
    return Route(name, f"http://127.0.0.1:{port}", str(folder), kind, str(folder), token_budget(folder, serve_config),
                 ignore_eos_body=ignore_eos_body(folder))


def plan_transformers(run: RunConfig, serve_config: ServeConfig, finetuned: str = "merged",
                      work_dir: Path | None = None) -> list[EnginePlan]:
    """finetuned='merged' serves RunConfig.merged_dir; 'adapter-4bit' serves base in NF4 with the adapter unmerged."""
    port = serve_config.backend_port
    plans: list[EnginePlan] = []
    if finetuned == "merged":
        folder = require_folder(run.merged_dir, "config.json", "train export")
        argv = transformers_argv(folder, port, serve_config)
        kind = "merged"
    elif finetuned == "adapter-4bit":
        if work_dir is None:
            raise ValueError("adapter-4bit needs a work_dir for the adapter view")
        folder = adapter_view(run, work_dir / "adapter-view")
        argv = transformers_argv(folder, port, serve_config, quantization="bnb-4bit")
        kind = "adapter-4bit"
    else:
        raise ValueError(f"finetuned must be 'merged' or 'adapter-4bit', got {finetuned!r}")
    plans.append(EnginePlan("finetuned", argv, port,
                            [route(serve_config.finetuned_name, port, folder, kind, serve_config)]))
    if serve_config.serve_base:
        base = require_folder(run.base_model_dir, "config.json", "prepare")
        port += 1
        plans.append(EnginePlan("base", transformers_argv(base, port, serve_config), port,
                                [route(serve_config.base_name, port, base, "base", serve_config)]))
    return plans


def engine_budget(base: Path, serve_config: ServeConfig, engine: str) -> TokenBudget | None:
    """What one request may hold on a one-process engine: vLLM's --max-model-len where serve.vllm_args sets it,
    else the model's context."""
    args = serve_config.vllm_args
    if engine == "vllm":
        for i, arg in enumerate(args):
            if arg.startswith("--max-model-len="):
                return TokenBudget(int(arg.split("=", 1)[1]), "vLLM's --max-model-len")
            if arg == "--max-model-len" and i + 1 < len(args):
                return TokenBudget(int(args[i + 1]), "vLLM's --max-model-len")
    return token_budget(base, serve_config.model_copy(update={"continuous_batching": False}))


def card_root(folder: Path, serve_config: ServeConfig) -> str:
    """A card's `root` without the server's absolute paths: a stored adapter's folder within the run store (the
    `lora_path` a load accepts), any other folder by its name."""
    try:
        return folder.resolve().relative_to(Path(serve_config.runs_store).resolve()).as_posix()
    except ValueError:
        return folder.name


def adapter_route(entry: AdapterEntry, url: str, base: Path, serve_config: ServeConfig, engine: str) -> Route:
    """An adapter's route on a multi-adapter engine (the engine knows it by its public name); its card names the
    base as parent and the adapter folder as root, as vLLM's does. The gateway counts its prompts with the base's
    tokenizer."""
    budget = engine_budget(base, serve_config, engine)
    return Route(entry.name, url, entry.name, "adapter", str(base) if budget else None, budget, entry,
                 root=card_root(Path(entry.adapter_dir), serve_config), parent=serve_config.base_name, engine=engine)


def base_route(base: Path, url: str, serve_config: ServeConfig, engine: str) -> Route:
    budget = engine_budget(base, serve_config, engine)
    return Route(serve_config.base_name, url, serve_config.base_name, "base", str(base) if budget else None, budget,
                 root=card_root(base, serve_config), engine=engine)


def stored_folder(entry: AdapterEntry) -> str:
    return entry.adapter_dir


def lora_modules(adapters: list[AdapterEntry], base_name: str,
                 folder: Callable[[AdapterEntry], str] = stored_folder) -> list[str]:
    """vLLM's JSON `--lora-modules` entries (any path, `=` and `,` included), each naming its base; `folder(entry)`
    is the path the engine reads."""
    return [json.dumps({"name": entry.name, "path": folder(entry), "base_model_name": base_name})
            for entry in adapters]


def plan_peft(run: RunConfig, serve_config: ServeConfig, adapters: list[AdapterEntry]) -> list[EnginePlan]:
    """One CPU process: the base once, every adapter on it (workloads.serve.engine.server)."""
    base = require_folder(run.base_model_dir, "config.json", "prepare")
    port = serve_config.backend_port
    argv = [sys.executable, "-m", "workloads.serve.engine.server", "--base", str(base),
            "--base-name", serve_config.base_name, "--host", "127.0.0.1", "--port", str(port), "--dtype", serve_config.dtype, "--device", serve_config.device,
            "--max-batch", str(serve_config.max_batch), "--max-loras", str(max(serve_config.max_loras, len(adapters))),
            "--max-tokens", str(serve_config.max_tokens_limit),
            *(["--runs-store", serve_config.runs_store, "--stack", serve_config.stack] if serve_config.stack else []),
            "--lora-modules", *lora_modules(adapters, serve_config.base_name)]
    url = f"http://127.0.0.1:{port}"
    routes = [adapter_route(entry, url, base, serve_config, "peft") for entry in adapters]
    if serve_config.serve_base:
        routes.append(base_route(base, url, serve_config, "peft"))
    return [EnginePlan("peft", argv, port, routes)]


def adapter_rank(entry: AdapterEntry) -> int:
    """The rank the adapter's own adapter_config.json gives (r, and any larger rank_pattern value)."""
    config = read_adapter_config(Path(entry.adapter_dir))
    pattern = (config.model_extra or {}).get("rank_pattern") or {}
    return max([config.r, *(int(r) for r in pattern.values())])


def check_rank(entry: AdapterEntry, max_rank: int) -> None:
    """Refuse an adapter over the server's --max-lora-rank before vLLM sees it (vLLM would fail the whole start,
    or refuse a runtime load with an opaque error)."""
    rank = adapter_rank(entry)
    if rank > max_rank:
        remedy = (f"set serve.max_lora_rank to {derived_rank([rank])}" if rank <= VLLM_LORA_RANKS[-1] else
                  f"vLLM serves ranks up to {VLLM_LORA_RANKS[-1]}: serve it with engine peft")
        raise ValueError(f"adapter {entry.name!r} has LoRA rank {rank}, over serve.max_lora_rank {max_rank} "
                         f"(vLLM --max-lora-rank): {remedy}")


def vllm_max_rank(run: RunConfig, serve_config: ServeConfig, adapters: list[AdapterEntry]) -> int:
    """--max-lora-rank: serve.max_lora_rank where set (the launcher sets it from the run and its store:
    launch.served_rank_limit), else the smallest rank vLLM takes that holds the run's own train.lora.r and the adapters
    served at start (planning.serving); every adapter at start checked against it."""
    limit = rank_limit(serve_config.max_lora_rank, served_ranks(run, (adapter_rank(e) for e in adapters)))
    for entry in adapters:
        check_rank(entry, limit)
    return limit


def vllm_lora_slots(serve_config: ServeConfig, held: int) -> tuple[int, int]:
    """(--max-loras, --max-cpu-loras): adapters one batch mixes, adapters held (vLLM wants the first <= the second)."""
    held = max(serve_config.max_loras, held)
    return min(serve_config.max_loras_per_batch, held), held


def vllm_template_flag(install: VllmInstall, base: Path) -> list[str]:
    """--default-chat-template-kwargs where the template has a thinking switch; a vLLM too old for the flag is
    refused rather than started with thinking on (prompts unlike training's)."""
    flag = template_flag("--default-chat-template-kwargs", base)
    if flag and not install.knows(flag[0]):
        since = ".".join(map(str, FLAG_SINCE[flag[0]]))
        raise ValueError(f"vLLM {install.version} ({install.distribution}, {install.python}) has no {flag[0]} (from "
                         f"{since}); {base}'s chat template needs it to turn thinking off: upgrade the serving environment")
    return flag


def plan_vllm(run: RunConfig, serve_config: ServeConfig, adapters: list[AdapterEntry],
              install: VllmInstall, folder: Callable[[AdapterEntry], str] = stored_folder) -> list[EnginePlan]:
    """One vLLM process with every adapter, `max_loras_per_batch` GPU slots, room for `max_loras` held, and
    runtime load/unload enabled: it listens on loopback and answers only requests with the launch's engine key
    (VLLM_API_KEY, set by the launcher), so only the gateway's admin routes reach it. Started empty, it gets no
    --lora-modules (a list flag vLLM refuses without a value). vLLM reads each adapter from `folder(entry)` (the
    launcher's private copy: workloads.serve.adapter_files.engine_copy)."""
    base = require_folder(run.base_model_dir, "config.json", "prepare")
    port = serve_config.backend_port
    per_batch, held = vllm_lora_slots(serve_config, len(adapters))
    modules = ["--lora-modules", *lora_modules(adapters, serve_config.base_name, folder)] if adapters else []
    argv = [*install.command(), str(base), "--served-model-name", serve_config.base_name, "--enable-lora", *modules,
            "--max-loras", str(per_batch), "--max-cpu-loras", str(held),
            "--max-lora-rank", str(vllm_max_rank(run, serve_config, adapters)), *vllm_template_flag(install, base),
            "--host", "127.0.0.1", "--port", str(port), *serve_config.vllm_args]
    url = f"http://127.0.0.1:{port}"
    routes = [adapter_route(entry, url, base, serve_config, "vllm") for entry in adapters]
    if serve_config.serve_base:
        routes.append(base_route(base, url, serve_config, "vllm"))
    return [EnginePlan("vllm", argv, port, routes, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})]
