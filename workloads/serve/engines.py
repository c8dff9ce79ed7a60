"""Engine processes behind the gateway, as pure plans: `transformers serve` per model, or one vLLM with LoRA.

transformers serve runs one continuous-batching model per process (switching models inside one process stops
and restarts its batching worker), so base and fine-tuned each get their own process and loopback port.
vLLM serves the base weights and the adapter (`--enable-lora`) from one process under both names.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from documents.hf_files import read_adapter_config, write_adapter_config
from documents.run_config import RunConfig
from workloads.serve.budget import token_budget
from documents.sections.serve import ServeConfig
from workloads.serve.gateway import Route

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "config.json")

VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
CPU_CACHE_SHARE = 0.1


@dataclass(frozen=True)
class EnginePlan:
    label: str
    argv: list[str]
    port: int
    routes: list[Route] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def choose_engine(cfg: ServeConfig) -> str:
    if cfg.engine != "auto":
        return cfg.engine
    import torch

    return "vllm" if importlib.util.find_spec("vllm") and torch.cuda.is_available() else "transformers"


def on_cpu(device: str) -> bool:
    if device != "auto":
        return device == "cpu"
    import torch

    return not torch.cuda.is_available()


def cb_flags(cfg: ServeConfig) -> list[str]:
    """KV cache sizing. Unbounded, transformers takes 60% of free RAM per CPU engine: two engines exhaust it."""
    flags = []
    for flag, value in (("--cb-num-blocks", cfg.cb_num_blocks), ("--cb-max-batch-tokens", cfg.cb_max_batch_tokens),
                        ("--cb-max-memory-percent", cfg.cb_max_memory_percent)):
        if value is not None:
            flags += [flag, str(value)]
    if not flags and on_cpu(cfg.device):
        flags = ["--cb-max-memory-percent", str(CPU_CACHE_SHARE)]
    return flags


def transformers_argv(folder: Path, port: int, cfg: ServeConfig, quantization: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(folder),
            "--host", "127.0.0.1", "--port", str(port), "--device", cfg.device, "--dtype", cfg.dtype,
            "--log-level", "warning"]
    if cfg.continuous_batching:
        argv += ["--continuous-batching", *cb_flags(cfg)]
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


def route(name: str, port: int, folder: Path, kind: str, cfg: ServeConfig) -> Route:
    """A transformers engine's route: the gateway counts prompts with the folder's tokenizer against its budget."""
    return Route(name, f"http://127.0.0.1:{port}", str(folder), kind, str(folder), token_budget(folder, cfg))


def plan_transformers(run: RunConfig, cfg: ServeConfig, finetuned: str = "merged", work_dir: Path | None = None) -> list[EnginePlan]:
    """finetuned='merged' serves RunConfig.merged_dir; 'adapter-4bit' serves base in NF4 with the adapter unmerged."""
    port = cfg.backend_port
    plans: list[EnginePlan] = []
    if finetuned == "merged":
        folder = require_folder(run.merged_dir, "config.json", "train export")
        argv = transformers_argv(folder, port, cfg)
        kind = "merged"
    elif finetuned == "adapter-4bit":
        if work_dir is None:
            raise ValueError("adapter-4bit needs a work_dir for the adapter view")
        folder = adapter_view(run, work_dir / "adapter-view")
        argv = transformers_argv(folder, port, cfg, quantization="bnb-4bit")
        kind = "adapter-4bit"
    else:
        raise ValueError(f"finetuned must be 'merged' or 'adapter-4bit', got {finetuned!r}")
    plans.append(EnginePlan("finetuned", argv, port, [route(cfg.finetuned_name, port, folder, kind, cfg)]))
    if cfg.serve_base:
        base = require_folder(run.base_model_dir, "config.json", "prepare")
        port += 1
        plans.append(EnginePlan("base", transformers_argv(base, port, cfg), port,
                                [route(cfg.base_name, port, base, "base", cfg)]))
    return plans


def plan_vllm(run: RunConfig, cfg: ServeConfig) -> list[EnginePlan]:
    base = require_folder(run.base_model_dir, "config.json", "prepare")
    adapter = require_folder(run.adapter_dir, "adapter_config.json", "train")
    rank = read_adapter_config(adapter).r
    max_rank = next((r for r in VLLM_LORA_RANKS if r >= rank), rank)
    port = cfg.backend_port
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(base),
            "--served-model-name", cfg.base_name, "--enable-lora", "--lora-modules", f"{cfg.finetuned_name}={adapter}",
            "--max-lora-rank", str(max_rank), "--host", "127.0.0.1", "--port", str(port), *cfg.vllm_args]
    url = f"http://127.0.0.1:{port}"
    routes = [Route(cfg.finetuned_name, url, cfg.finetuned_name, "adapter-lora")]
    if cfg.serve_base:
        routes.append(Route(cfg.base_name, url, cfg.base_name, "base"))
    return [EnginePlan("vllm", argv, port, routes)]
