"""What the gateway serves under one public name: the engine behind it, the engine's own name for it, the token
budget its requests are counted against and, for an adapter, its registry entry. The launcher plans routes
(workloads.serve.launcher.engine_plan), the gateway serves them; plain data, no HTTP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from documents.adapter_registry import AdapterEntry
from workloads.serve.token_budget import TokenBudget


@dataclass(frozen=True)
class Route:
    name: str
    url: str
    upstream: str
    kind: str
    tokenizer: str | None = None
    budget: TokenBudget | None = None
    adapter: AdapterEntry | None = None
    root: str | None = None
    """the folder served (vLLM's card `root`)"""
    parent: str | None = None
    """an adapter's base model name (vLLM's card `parent`)"""
    engine: str = "transformers"
    """the engine process behind it: transformers, peft or vllm (what request fields it honours)"""
    ignore_eos_body: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})
    """the body fields that make the route's engine ignore the end-of-sequence token (vLLM's and the peft
    engine's `ignore_eos`; transformers serve takes a whole `generation_config` instead)"""
